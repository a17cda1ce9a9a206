#pragma once

// The communication of tensor parallelism as autograd functions (Megatron-LM's f and g,
// and the sequence-parallel pairs), on the tensor-parallel group. A tensor split along a
// dimension follows torch.chunk's rule (Note [Uneven shards] in tp_comm.cpp).

#include <ddp/distributed/process_group.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ddp {
namespace detail {
namespace tp {

/// torch.chunk's lengths of `total` over `n` ranks: ceil(total / n) each, the last ones
/// shorter or empty.
std::vector<int64_t> chunk_sizes(int64_t total, int64_t n);
/// The first index of rank `r`'s chunk.
int64_t chunk_offset(int64_t total, int64_t n, int64_t r);

/// All ranks' slices of `x` along `dim` (of lengths `sizes`) put together; no autograd.
at::Tensor gather_along(const at::Tensor& x, int64_t dim, const std::vector<int64_t>& sizes,
                        ProcessGroup& group);

/// Every rank's length along `dim` of `local` (one small all-gather).
std::vector<int64_t> exchange_sizes(ProcessGroup& group, const at::Tensor& local, int64_t dim);

/// Forward: identity. Backward: the gradients summed over the group (a whole input
/// feeding a ColwiseParallel layer, whose gradient each rank has a part of).
at::Tensor copy_to(const at::Tensor& x, std::shared_ptr<ProcessGroup> group);
/// Forward: summed over the group. Backward: identity (RowwiseParallel's whole output).
at::Tensor reduce_from(const at::Tensor& x, std::shared_ptr<ProcessGroup> group);
/// Forward: the ranks' slices along `dim` (of lengths `sizes`) put together. Backward:
/// this rank's slice of the gradient (the consumer of the whole tensor is replicated).
at::Tensor gather_from(const at::Tensor& x, int64_t dim, std::vector<int64_t> sizes,
                       std::shared_ptr<ProcessGroup> group);
/// Forward: this rank's slice along `dim`. Backward: the slices' gradients gathered.
at::Tensor split_to(const at::Tensor& x, int64_t dim, std::vector<int64_t> sizes,
                    std::shared_ptr<ProcessGroup> group);
/// Forward: summed over the group and cut along `dim` (reduce-scatter). Backward: the
/// slices' gradients gathered (sequence parallelism after a RowwiseParallel layer).
at::Tensor reduce_scatter_to(const at::Tensor& x, int64_t dim, std::vector<int64_t> sizes,
                             std::shared_ptr<ProcessGroup> group);
/// Forward: the slices along `dim` gathered. Backward: the gradient reduce-scattered
/// (sequence parallelism before a ColwiseParallel layer).
at::Tensor all_gather_to(const at::Tensor& x, int64_t dim, std::vector<int64_t> sizes,
                         std::shared_ptr<ProcessGroup> group);

}  // namespace tp
}  // namespace detail
}  // namespace ddp
