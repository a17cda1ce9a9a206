#pragma once

// The two halves of a synchronised batch-norm step, below the module:
//   gather_batch_stats    forward statistics of the whole batch (one all-gather)
//   sync_batch_norm       the normalisation as an autograd Function whose backward
//                         all-reduces the two per-channel sums the input gradient needs
// sync_batchnorm_stats.cpp and sync_batchnorm_function.cpp hold them; the maths is in
// docs/sync_batchnorm.md.

#include <ddp/distributed/process_group.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ddp {
namespace detail {

/// The per-channel statistics of every rank's batch together.
struct GlobalBatchStats {
  at::Tensor mean;    // [C], float64, on the input's device
  at::Tensor var;     // [C], float64, biased (divided by count)
  int64_t count = 0;  // values per channel over all ranks: sum of N * prod(spatial)
};

/// Every dimension of an (N, C, ...) tensor but the channel one: {0, 2, 3, ...}.
std::vector<int64_t> reduced_dims(const at::Tensor& input);

/// Note [Count-weighted combine]: each rank contributes its own mean, biased variance and
/// count; the group's are combined with the parallel-variance formula. One all-gather
/// of 2C + 1 float64 values. Every rank must call it with the same C.
GlobalBatchStats gather_batch_stats(const at::Tensor& input, ProcessGroup& group);

/// (input - mean) * invstd * weight + bias, per channel, differentiable in input, weight
/// and bias. Its backward all-reduces sum(dy) and sum(dy * (x - mean)) over `group` when
/// input needs a gradient (Note [Collective order] in sync_batchnorm_function.cpp).
/// weight and bias may both be undefined (affine = false). mean and invstd are [C] in any
/// floating dtype; count is the group's count from gather_batch_stats.
at::Tensor sync_batch_norm(const at::Tensor& input, const at::Tensor& weight,
                           const at::Tensor& bias, const at::Tensor& mean, const at::Tensor& invstd,
                           int64_t count, std::shared_ptr<ProcessGroup> group);

}  // namespace detail
}  // namespace ddp
