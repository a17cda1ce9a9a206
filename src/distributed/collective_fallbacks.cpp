// The collectives of torch.distributed beyond all_reduce, broadcast and all_gather, for a
// Comm that has no own: Note [Collective fallbacks].
//
// Note [Collective fallbacks]
// Each is built from collectives that every backend has, so that every op works on every
// Comm, and a backend overrides only what it does better:
//   reduce          all_reduce, of a scratch copy on the ranks other than dst (whose
//                   tensors are left as they were)
//   gather          all_gather, into scratch tensors on the ranks other than dst
//   scatter         a broadcast of the concatenated list from src; each rank copies its
//                   part out
//   reduce_scatter  the list concatenated, then reduce_scatter_tensor_scratch (Note [Flat
//                   collective fallbacks]): Gloo in LibTorch 1.13 has no reduce_scatter,
//                   and 2.x's keeps its buffers (Note [Gloo's reduce-scatter keeps its
//                   output]), so Gloo always takes this path
//   all_to_all      all_to_all_single over the concatenated, flattened tensors, split by
//                   their element counts: Gloo in LibTorch 1.13 has no list all_to_all,
//                   and 2.x's wants every tensor of one size
// all_to_all_single and point to point have no fallback: every backend that can be made
// has them (Gloo, NCCL; shm, hier and standin through their Gloo groups), and LocalComm
// never needs them (a rank cannot send to itself).
// The fallbacks move more bytes than a native op (reduce and gather: all of them to every
// rank; scatter: the whole list to every rank), never different values: an exact
// reduction gives the same bits, and an inexact one the bits of the all-reduce it is
// made of.

#include "distributed/common/check.h"
#include "distributed/comm.h"

#include <ATen/ATen.h>

namespace ddp {
namespace detail {
namespace {

at::Tensor flat_cat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const at::Tensor& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

}  // namespace

std::shared_ptr<PendingWork> Comm::reduce(std::vector<at::Tensor>& tensors, int dst, ReduceOp op) {
  check_devices("reduce", tensors);
  std::vector<at::Tensor> work_on{config_->rank == dst ? tensors[0] : tensors[0].clone()};
  return then_work(all_reduce(work_on, op), nullptr, tensors);
}

std::shared_ptr<PendingWork> Comm::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs, int dst) {
  check_devices("gather", inputs);
  std::vector<std::vector<at::Tensor>> into(1);
  if (config_->rank == dst) {
    into[0] = outputs[0];
  } else {
    for (int r = 0; r < config_->world_size; ++r) into[0].push_back(at::empty_like(inputs[0]));
  }
  return then_work(all_gather(into, inputs), nullptr, config_->rank == dst ? outputs[0] : inputs);
}

std::shared_ptr<PendingWork> Comm::scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs, int src) {
  check_devices("scatter", outputs);
  const at::Tensor& out = outputs[0];
  const int64_t n = out.numel();
  std::vector<at::Tensor> flat{config_->rank == src
                                   ? flat_cat(inputs[0])
                                   : at::empty({n * config_->world_size}, out.options())};
  at::Tensor mine = flat[0].narrow(0, n * config_->rank, n).view(out.sizes());
  return copy_after_work(broadcast(flat, src), mine, out);
}

std::shared_ptr<PendingWork> Comm::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  ReduceOp op) {
  return reduce_scatter_by_flat(outputs, inputs, op);
}

std::shared_ptr<PendingWork> Comm::reduce_scatter_by_flat(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs, ReduceOp op) {
  check_devices("reduce_scatter", inputs[0]);
  at::Tensor flat = flat_cat(inputs[0]);  // a copy of the caller's: scratch
  at::Tensor out = outputs[0];
  return then_work(reduce_scatter_tensor_scratch(out, flat, op), nullptr, outputs);
}

std::shared_ptr<PendingWork> Comm::all_to_all(std::vector<at::Tensor>& outputs,
                                              std::vector<at::Tensor>& inputs) {
  return all_to_all_by_single(outputs, inputs);
}

std::shared_ptr<PendingWork> Comm::all_to_all_by_single(std::vector<at::Tensor>& outputs,
                                                        std::vector<at::Tensor>& inputs) {
  check_devices("all_to_all", inputs);
  check_devices("all_to_all (outputs)", outputs);
  std::vector<int64_t> in_splits;
  std::vector<int64_t> out_splits;
  int64_t out_total = 0;
  for (const at::Tensor& t : inputs) in_splits.push_back(t.numel());
  for (const at::Tensor& t : outputs) {
    out_splits.push_back(t.numel());
    out_total += t.numel();
  }
  at::Tensor in_flat = flat_cat(inputs);
  at::Tensor out_flat = at::empty({out_total}, outputs[0].options());
  std::vector<at::Tensor> targets = outputs;
  // c10d may move from the split vectors it is given: it gets copies.
  std::vector<int64_t> out_counts = out_splits;
  std::vector<int64_t> in_counts = in_splits;
  auto work = all_to_all_single(out_flat, in_flat, out_counts, in_counts);
  return then_work(
      std::move(work),
      [out_flat, targets, out_splits]() mutable {
        int64_t offset = 0;
        for (size_t r = 0; r < targets.size(); ++r) {
          targets[r].copy_(out_flat.narrow(0, offset, out_splits[r]).view(targets[r].sizes()));
          offset += out_splits[r];
        }
      },
      outputs);
}

std::shared_ptr<PendingWork> Comm::all_to_all_single(at::Tensor&, at::Tensor&,
                                                     std::vector<int64_t>&, std::vector<int64_t>&) {
  throw_error(c10::str("all_to_all_single on ", where(*config_), ": this backend has none."));
}

std::shared_ptr<PendingWork> Comm::send(std::vector<at::Tensor>&, int, int) {
  throw_error(c10::str("send on ", where(*config_), ": this backend has no point-to-point ops."));
}

std::shared_ptr<PendingWork> Comm::recv(std::vector<at::Tensor>&, int, int) {
  throw_error(c10::str("recv on ", where(*config_), ": this backend has no point-to-point ops."));
}

std::vector<std::shared_ptr<PendingWork>> Comm::batch_p2p(std::vector<P2P>& ops) {
  std::vector<std::shared_ptr<PendingWork>> works;
  works.reserve(ops.size());
  for (P2P& op : ops) {
    std::vector<at::Tensor> one{op.tensor};
    works.push_back(op.send ? send(one, op.peer, op.tag) : recv(one, op.peer, op.tag));
  }
  return works;
}

}  // namespace detail
}  // namespace ddp
