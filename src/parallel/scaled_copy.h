#pragma once

#include <cstddef>

namespace at {
class Tensor;
}

namespace ddp {
namespace detail {

// dst[i] = src[i] * scale for i in [0, n), in float32, with the same bits as
// at::mul_out(dst, src, scale): one IEEE multiply per element by the scale rounded to
// float. Copies of at least kStreamingCopyBytes bypass the cache (non-temporal stores
// where the CPU has them): a bucket that large is not read again before it leaves the
// cache anyway, and a store that bypasses it does not first read the line it overwrites,
// so the pass moves two bytes per byte copied instead of three. Note [Streaming bucket
// copies] in scaled_copy.cpp.
void scaled_copy(float* dst, const float* src, size_t n, float scale);

// memcpy, with the same non-temporal stores from kStreamingCopyBytes on.
void streaming_copy(void* dst, const void* src, size_t bytes);

constexpr size_t kStreamingCopyBytes = size_t{4} << 20;

// Whether a copy of `bytes` takes the non-temporal path: where the CPU has such stores
// (x86-64), from kStreamingCopyBytes on. Elsewhere the callers keep ATen's own kernels.
bool streaming_copy_pays(size_t bytes);

// The reducer's two copies (Note [Streaming bucket copies]): a gradient into its bucket,
// multiplied by `inverse` (a 0-dim tensor, 1/world_size), as at::mul_out(dst, src,
// inverse); and a reduced bucket view back into a gradient, as dst.copy_(src). Large
// contiguous CPU copies (float32 for the first) take the non-temporal path above, the
// rest ATen's kernels; the bits are the same either way.
void copy_scaled(at::Tensor& dst, const at::Tensor& src, const at::Tensor& inverse);
void copy_plain(at::Tensor& dst, const at::Tensor& src);

}  // namespace detail
}  // namespace ddp
