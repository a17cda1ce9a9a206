#pragma once

// The transport's reduction kernels: the loops that every path of an all-reduce runs its
// elements through. shm_kernels.cpp is the only file of the transport built with -O3
// (these loops must vectorize), and it is built without contracting a product and a sum
// into a fused multiply-add (fold_scaled). Internal to the transport.

#include "distributed/shm/shm_transport.h"

#include <cstddef>

namespace ddp {
namespace detail {
namespace shm {

/// out[i] = in[0][i] (+) in[1][i] (+) ... (+) in[n-1][i], in that order, for i in
/// [begin, end), with `op` over `dtype` elements, and the same into
/// copies[0..num_copies)[i]. out or a copy may be one of the inputs.
void reduce(DType dtype, Op op, void* out, void* const* copies, int num_copies,
            const void* const* in, int n, size_t begin, size_t end);

/// out[i] = (...((in[0][i] * s[0] + in[1][i] * s[1]) + in[2][i] * s[2]) ...) +
/// in[n-1][i] * s[n-1], for i < count, in float32 or float64 (the scales rounded to it),
/// each product and each sum rounded, as each rank scaling its values into a buffer and
/// then summing the buffers does. `out` may be one of the inputs.
void fold_scaled(DType dtype, void* out, const void* const* in, int n, size_t count,
                 const double* scales);

}  // namespace shm
}  // namespace detail
}  // namespace ddp
