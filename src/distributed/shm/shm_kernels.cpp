#include "distributed/shm/shm_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ddp {
namespace detail {
namespace shm {
namespace {

// ---- Reduction kernels ---------------------------------------------------------------
//
// float16 and bfloat16 are reduced in float32 and rounded once (round to nearest even),
// with the conversions of the FP16 library (as in c10).

float bits_to_float(uint32_t w) {
  float f;
  std::memcpy(&f, &w, sizeof(f));
  return f;
}

uint32_t float_to_bits(float f) {
  uint32_t w;
  std::memcpy(&w, &f, sizeof(w));
  return w;
}

struct Half {
  using Acc = float;
  static float load(uint16_t h) {
    const uint32_t w = static_cast<uint32_t>(h) << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = bits_to_float((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = bits_to_float((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t result =
        sign | (two_w < (1u << 27) ? float_to_bits(denormalized) : float_to_bits(normalized));
    return bits_to_float(result);
  }
  static uint16_t store(float f) {
    float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = float_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = bits_to_float((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = float_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
  }
};

struct BFloat16 {
  using Acc = float;
  static float load(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }
  static uint16_t store(float f) {
    if (std::isnan(f)) return 0x7FC0;
    const uint32_t u = float_to_bits(f);
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
};

template <typename T>
struct Same {
  using Acc = T;
  static T load(T v) { return v; }
  static T store(T v) { return v; }
};

template <typename T>
T sum(T a, T b) {
  if constexpr (std::is_integral_v<T>) {  // wraps, as two's complement hardware does
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
// NaN wins, as in torch.maximum / torch.minimum.
template <typename T>
T max_of(T a, T b) {
  return (a > b || a != a) ? a : b;
}
template <typename T>
T min_of(T a, T b) {
  return (a < b || a != a) ? a : b;
}

// out[i] = in[0][i] (+) in[1][i] (+) ... (+) in[n-1][i], in that order, for i in
// [begin, end), and the same into copies[0..num_copies)[i]. Accumulates a block at a
// time in a local array that stays in L1, so each pass is a plain loop the compiler
// vectorizes. out or a copy may be one of the inputs: a block is read whole before it
// is written.
template <typename T, typename Cv, typename F>
void reduce_range(void* out_v, void* const* copies, int num_copies, const void* const* in_v, int n,
                  size_t begin, size_t end, F f) {
  using Acc = typename Cv::Acc;
  constexpr size_t kBlock = 1024;
  Acc acc[kBlock];
  T* out = static_cast<T*>(out_v);
  for (size_t b = begin; b < end; b += kBlock) {
    const size_t m = std::min(kBlock, end - b);
    const T* s0 = static_cast<const T*>(in_v[0]) + b;
    for (size_t i = 0; i < m; ++i) acc[i] = Cv::load(s0[i]);
    for (int k = 1; k < n; ++k) {
      const T* s = static_cast<const T*>(in_v[k]) + b;
      for (size_t i = 0; i < m; ++i) acc[i] = f(acc[i], Cv::load(s[i]));
    }
    for (size_t i = 0; i < m; ++i) out[b + i] = Cv::store(acc[i]);
    for (int c = 0; c < num_copies; ++c) {
      std::memcpy(static_cast<T*>(copies[c]) + b, out + b, m * sizeof(T));
    }
  }
}

template <typename T, typename Cv>
void reduce_typed(Op op, void* out, void* const* copies, int num_copies, const void* const* in,
                  int n, size_t begin, size_t end) {
  using Acc = typename Cv::Acc;
  switch (op) {
    case Op::kSum:
      return reduce_range<T, Cv>(out, copies, num_copies, in, n, begin, end,
                                 [](Acc a, Acc b) { return sum(a, b); });
    case Op::kMax:
      return reduce_range<T, Cv>(out, copies, num_copies, in, n, begin, end,
                                 [](Acc a, Acc b) { return max_of(a, b); });
    case Op::kMin:
      return reduce_range<T, Cv>(out, copies, num_copies, in, n, begin, end,
                                 [](Acc a, Acc b) { return min_of(a, b); });
  }
}

template <typename T>
void fold_scaled_typed(T* out, const void* const* in_v, int n, size_t count, const double* scales) {
  // Two roundings per term, as the bucket path's scaled copy and then its sum (this file
  // is built without contracting them into a fused multiply-add).
  if (n == 2) {  // the common case, in one pass
    const T* a = static_cast<const T*>(in_v[0]);
    const T* b = static_cast<const T*>(in_v[1]);
    const T sa = static_cast<T>(scales[0]);
    const T sb = static_cast<T>(scales[1]);
    for (size_t i = 0; i < count; ++i) {
      const T x = a[i] * sa;
      const T y = b[i] * sb;
      out[i] = x + y;
    }
    return;
  }
  constexpr size_t kBlock = 1024;
  T acc[kBlock];
  for (size_t b = 0; b < count; b += kBlock) {
    const size_t m = std::min(kBlock, count - b);
    const T* s0 = static_cast<const T*>(in_v[0]) + b;
    const T scale0 = static_cast<T>(scales[0]);
    for (size_t i = 0; i < m; ++i) acc[i] = s0[i] * scale0;
    for (int k = 1; k < n; ++k) {
      const T* sk = static_cast<const T*>(in_v[k]) + b;
      const T scale = static_cast<T>(scales[k]);
      for (size_t i = 0; i < m; ++i) {
        const T scaled = sk[i] * scale;
        acc[i] = acc[i] + scaled;
      }
    }
    std::copy(acc, acc + m, out + b);
  }
}

}  // namespace

void reduce(DType dtype, Op op, void* out, void* const* copies, int num_copies,
            const void* const* in, int n, size_t begin, size_t end) {
  switch (dtype) {
    case DType::kFloat32:
      return reduce_typed<float, Same<float>>(op, out, copies, num_copies, in, n, begin, end);
    case DType::kFloat64:
      return reduce_typed<double, Same<double>>(op, out, copies, num_copies, in, n, begin, end);
    case DType::kFloat16:
      return reduce_typed<uint16_t, Half>(op, out, copies, num_copies, in, n, begin, end);
    case DType::kBFloat16:
      return reduce_typed<uint16_t, BFloat16>(op, out, copies, num_copies, in, n, begin, end);
    case DType::kInt32:
      return reduce_typed<int32_t, Same<int32_t>>(op, out, copies, num_copies, in, n, begin, end);
    case DType::kInt64:
      return reduce_typed<int64_t, Same<int64_t>>(op, out, copies, num_copies, in, n, begin, end);
  }
}

void fold_scaled(DType dtype, void* out, const void* const* in, int n, size_t count,
                 const double* scales) {
  if (dtype == DType::kFloat64) {
    fold_scaled_typed(static_cast<double*>(out), in, n, count, scales);
  } else {
    fold_scaled_typed(static_cast<float*>(out), in, n, count, scales);
  }
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  return 1;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "?";
}

const char* op_name(Op op) {
  switch (op) {
    case Op::kSum:
      return "SUM";
    case Op::kMax:
      return "MAX";
    case Op::kMin:
      return "MIN";
  }
  return "?";
}

}  // namespace shm
}  // namespace detail
}  // namespace ddp
