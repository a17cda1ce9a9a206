#include "parallel/module_sync.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <utility>

namespace ddp {
namespace detail {
namespace {

// Gloo has no bool reductions; bool and uint8 have the same size, so move the bits.
at::Tensor transport_view(const at::Tensor& t) {
  return t.scalar_type() == at::kBool ? t.view(at::kByte) : t;
}

void broadcast_chunk(ProcessGroup& pg, const std::vector<at::Tensor>& chunk, int src) {
  std::vector<at::Tensor> flat;
  for (const auto& t : chunk) flat.push_back(transport_view(t).reshape({-1}));
  if (flat.size() == 1) {  // a view of the tensor itself: received in place
    pg.broadcast(flat[0], src);
    return;
  }
  at::Tensor buffer = at::cat(flat);
  pg.broadcast(buffer, src);
  if (pg.rank() == src) return;
  int64_t offset = 0;
  for (const auto& t : chunk) {
    const int64_t n = t.numel();
    transport_view(t).view({-1}).copy_(buffer.narrow(0, offset, n));
    offset += n;
  }
}

} // namespace

void broadcast_coalesced(ProcessGroup& pg, const std::vector<at::Tensor>& tensors, int src,
                         size_t chunk_bytes) {
  if (pg.size() == 1) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> chunk;
  size_t bytes = 0;
  auto flush = [&] {
    if (!chunk.empty()) broadcast_chunk(pg, chunk, src);
    chunk.clear();
    bytes = 0;
  };
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    TORCH_CHECK(t.is_contiguous(), "DDP can only broadcast contiguous parameters and "
                "buffers, but got one with shape ", t.sizes(), " and strides ", t.strides(),
                "; make it contiguous before wrapping the module.");
    if (!chunk.empty() && (chunk.front().scalar_type() != t.scalar_type() ||
                           chunk.front().device() != t.device() ||
                           bytes + t.nbytes() > chunk_bytes)) {
      flush();
    }
    chunk.push_back(t);
    bytes += t.nbytes();
  }
  flush();
}

} // namespace detail
} // namespace ddp
