#pragma once

// Copies rank 0's parameters and buffers to every rank: at construction (so all ranks
// start from the same weights) and, for buffers, before each forward that records
// gradients (broadcast_buffers).

#include <ddp/distributed/process_group.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

namespace ddp {
namespace detail {

/// PyTorch's default for coalescing module state broadcasts.
constexpr size_t kBroadcastChunkBytes = 250u * 1024 * 1024;

/// Overwrites `tensors` on every rank with rank `src`'s values, in place, without
/// recording autograd history. Tensors of one dtype and device are flattened into
/// chunks of up to chunk_bytes, so a model costs a few collectives, not one per tensor.
void broadcast_coalesced(ProcessGroup& pg, const std::vector<at::Tensor>& tensors, int src,
                         size_t chunk_bytes = kBroadcastChunkBytes);

}  // namespace detail
}  // namespace ddp
