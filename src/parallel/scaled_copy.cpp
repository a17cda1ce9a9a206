#include "parallel/scaled_copy.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ddp {
namespace detail {

// Note [Streaming bucket copies]
// The default hook copies each gradient into its bucket, scaled by 1/world_size (Note
// [Pre-scaled buckets] in reducer.cpp). For a large model on a CPU this pass is bound by
// memory bandwidth, which both ranks of a host share with backward: an ordinary store
// first reads the destination line (write-allocate), so copying B bytes moves 3B. A
// non-temporal store writes the line without reading it: 2B. The bucket is read next by
// the all-reduce, after other gradients have gone through the cache, so keeping it cached
// bought little. Below kStreamingCopyBytes a bucket can still be in cache when it is
// reduced, and ordinary stores are kept.
bool streaming_copy_pays(size_t bytes) {
#if defined(__SSE2__)
  return bytes >= kStreamingCopyBytes;
#else
  (void)bytes;
  return false;
#endif
}

void scaled_copy(float* dst, const float* src, size_t n, float scale) {
  size_t i = 0;
#if defined(__SSE2__)
  if (n * sizeof(float) >= kStreamingCopyBytes) {
    for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 15) != 0; ++i) dst[i] = src[i] * scale;
    const __m128 k = _mm_set1_ps(scale);
    for (; i + 16 <= n; i += 16) {
      const __m128 a = _mm_loadu_ps(src + i);
      const __m128 b = _mm_loadu_ps(src + i + 4);
      const __m128 c = _mm_loadu_ps(src + i + 8);
      const __m128 d = _mm_loadu_ps(src + i + 12);
      _mm_stream_ps(dst + i, _mm_mul_ps(a, k));
      _mm_stream_ps(dst + i + 4, _mm_mul_ps(b, k));
      _mm_stream_ps(dst + i + 8, _mm_mul_ps(c, k));
      _mm_stream_ps(dst + i + 12, _mm_mul_ps(d, k));
    }
    // Non-temporal stores are weakly ordered: the fence makes them visible before
    // whatever publishes the bucket (the all-reduce's release store) to another process.
    _mm_sfence();
  }
#endif
  for (; i < n; ++i) dst[i] = src[i] * scale;
}

void streaming_copy(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  size_t i = 0;
#if defined(__SSE2__)
  if (bytes >= kStreamingCopyBytes) {
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);
    i = head;
    for (; i + 64 <= bytes; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    _mm_sfence();
  }
#endif
  std::memcpy(d + i, s + i, bytes - i);
}

namespace {

bool streams(const at::Tensor& dst, const at::Tensor& src) {
  return streaming_copy_pays(static_cast<size_t>(src.nbytes())) && dst.device().is_cpu() &&
         src.device().is_cpu() && dst.scalar_type() == src.scalar_type() && dst.is_contiguous() &&
         src.is_contiguous() && dst.numel() == src.numel();
}

}  // namespace

void copy_scaled(at::Tensor& dst, const at::Tensor& src, const at::Tensor& inverse) {
  if (src.scalar_type() == at::kFloat && streams(dst, src)) {
    scaled_copy(dst.data_ptr<float>(), src.data_ptr<float>(), static_cast<size_t>(src.numel()),
                static_cast<float>(inverse.item<double>()));
  } else {
    at::mul_out(dst, src, inverse);
  }
}

void copy_plain(at::Tensor& dst, const at::Tensor& src) {
  if (streams(dst, src)) {
    streaming_copy(dst.data_ptr(), src.data_ptr(), static_cast<size_t>(src.nbytes()));
  } else {
    dst.copy_(src);
  }
}

}  // namespace detail
}  // namespace ddp
