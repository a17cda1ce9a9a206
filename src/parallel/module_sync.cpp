#include "parallel/module_sync.h"

#include "distributed/comm.h"

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
  if (chunk.size() == 1 && chunk[0].is_contiguous()) {  // received in place
    at::Tensor flat = transport_view(chunk[0]).view({-1});
    pg.broadcast(flat, src);
    return;
  }
  // Any layout (channels_last, slices): flattened into one buffer in each tensor's
  // logical order, then copied back element by element.
  std::vector<at::Tensor> flat;
  for (const auto& t : chunk) flat.push_back(transport_view(t).reshape({-1}));
  at::Tensor buffer = flat.size() == 1 ? flat[0].clone() : at::cat(flat);
  pg.broadcast(buffer, src);
  if (pg.rank() == src) return;
  int64_t offset = 0;
  for (const auto& t : chunk) {
    const int64_t n = t.numel();
    transport_view(t).copy_(buffer.narrow(0, offset, n).view(t.sizes()));
    offset += n;
  }
}

}  // namespace

void broadcast_coalesced(ProcessGroup& pg, const std::vector<at::Tensor>& tensors, int src,
                         size_t chunk_bytes) {
  if (comm_of(pg).trivial()) return;
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
    if (!chunk.empty() &&
        (chunk.front().scalar_type() != t.scalar_type() || chunk.front().device() != t.device() ||
         bytes + t.nbytes() > chunk_bytes)) {
      flush();
    }
    chunk.push_back(t);
    bytes += t.nbytes();
  }
  flush();
}

}  // namespace detail
}  // namespace ddp
