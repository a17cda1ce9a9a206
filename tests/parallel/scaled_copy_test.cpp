// The bucket copies of the reducer (src/parallel/scaled_copy.h) against ATen and memcpy,
// bit for bit, on both sides of the streaming threshold and at unaligned addresses.

#include "parallel/scaled_copy.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace scaled_copy_test {

namespace {

using ddp::detail::kStreamingCopyBytes;

// Values with every kind of float: normal, subnormal, zero of both signs, inf, NaN.
at::Tensor awkward_floats(int64_t n) {
  auto t = at::randn({n}, at::TensorOptions().dtype(at::kFloat)) * 1e3;
  float* p = t.data_ptr<float>();
  const float special[] = {0.0f,
                           -0.0f,
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           1e-38f,
                           3.4e38f};
  for (int64_t i = 0; i < n; i += 97) p[i] = special[(i / 97) % 8];
  return t;
}

TEST(ScaledCopyTest, SameBitsAsAtenMulOutOnBothSidesOfTheThreshold) {
  const int64_t big = static_cast<int64_t>(kStreamingCopyBytes / sizeof(float)) + 37;
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{4099}, big}) {
    for (const int divisor : {1, 2, 3, 7}) {
      for (const int64_t dst_shift : {0, 1, 3}) {
        SCOPED_TRACE("n " + std::to_string(n) + ", divisor " + std::to_string(divisor) +
                     ", destination shifted by " + std::to_string(dst_shift) + " floats");
        const at::Tensor src = awkward_floats(n + 2).narrow(0, 2, n);  // unaligned source
        at::Tensor want = at::empty({n}, at::kFloat);
        at::mul_out(want, src, at::scalar_tensor(1.0 / divisor, at::kDouble));
        at::Tensor storage = at::full({n + dst_shift + 8}, 42.0f);
        at::Tensor got = storage.narrow(0, dst_shift, n);
        ddp::detail::scaled_copy(got.data_ptr<float>(), src.data_ptr<float>(),
                                 static_cast<size_t>(n), static_cast<float>(1.0 / divisor));
        EXPECT_TRUE(at::equal(got.view(at::kInt), want.view(at::kInt)));
        // Nothing written outside the destination.
        EXPECT_TRUE(at::equal(storage.narrow(0, 0, dst_shift), at::full({dst_shift}, 42.0f)));
        EXPECT_TRUE(at::equal(storage.narrow(0, dst_shift + n, 8), at::full({8}, 42.0f)));
      }
    }
  }
}

TEST(ScaledCopyTest, StreamingCopyEqualsMemcpyAtEveryAlignment) {
  for (const size_t bytes :
       {size_t{0}, size_t{5}, size_t{100}, kStreamingCopyBytes - 1, kStreamingCopyBytes + 13}) {
    std::vector<unsigned char> src(bytes + 16);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
    for (const size_t src_shift : {size_t{0}, size_t{3}}) {
      for (const size_t dst_shift : {size_t{0}, size_t{1}, size_t{9}}) {
        SCOPED_TRACE(std::to_string(bytes) + " bytes, source +" + std::to_string(src_shift) +
                     ", destination +" + std::to_string(dst_shift));
        std::vector<unsigned char> dst(bytes + 32, 0xAB);
        ddp::detail::streaming_copy(dst.data() + dst_shift, src.data() + src_shift, bytes);
        EXPECT_EQ(std::memcmp(dst.data() + dst_shift, src.data() + src_shift, bytes), 0);
        for (size_t i = 0; i < dst_shift; ++i) ASSERT_EQ(dst[i], 0xAB) << "byte " << i;
        for (size_t i = dst_shift + bytes; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xAB);
      }
    }
  }
}

TEST(ScaledCopyTest, LargeCopiesStreamWhereTheCpuCan) {
#if defined(__SSE2__)
  EXPECT_TRUE(ddp::detail::streaming_copy_pays(kStreamingCopyBytes));
#endif
  EXPECT_FALSE(ddp::detail::streaming_copy_pays(kStreamingCopyBytes - 1));
}

}  // namespace

}  // namespace scaled_copy_test
