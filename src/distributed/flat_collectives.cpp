// The flat collectives (reduce_scatter_tensor, all_gather_into_tensor) on any Comm, in
// terms of all_reduce and all_gather. See Note [Flat collective fallbacks]. An empty
// collective never reaches the backend: Gloo in 1.13 divides by the element count in
// its all-gather (SIGFPE).

#include "distributed/common/check.h"
#include "distributed/comm.h"

#include <ATen/ATen.h>

namespace ddp {
namespace detail {

void Comm::check_flat(const char* what, const at::Tensor& whole, const at::Tensor& part) const {
  const int world = config_->world_size;
  DDP_CHECK(whole.defined() && part.defined(), what, " on rank ", config_->rank,
            " got an undefined tensor");
  DDP_CHECK(whole.scalar_type() == part.scalar_type(), what, " on rank ", config_->rank,
            ": the flat tensor is ", whole.scalar_type(), " but the chunk is ", part.scalar_type(),
            "; both must have one dtype.");
  DDP_CHECK(whole.numel() == part.numel() * world, what, " on rank ", config_->rank,
            ": the flat tensor has ", whole.numel(), " elements, but world_size (", world,
            ") times the chunk's ", part.numel(), " is ", part.numel() * world,
            ". Size it as world_size chunks of the chunk's numel.");
  DDP_CHECK(whole.is_contiguous() && part.is_contiguous(), what, " on rank ", config_->rank,
            ": both tensors must be contiguous; call .contiguous() first.");
  check_devices(what, {whole, part});
}

std::shared_ptr<PendingWork> Comm::reduce_scatter_by_all_reduce(at::Tensor& output,
                                                                at::Tensor& input, ReduceOp op,
                                                                bool in_place) {
  if (output.numel() == 0) return done_work({output});
  // A copy, so that the caller's input keeps its values, as with a native reduce-scatter;
  // unless the caller said it is scratch.
  std::vector<at::Tensor> tensors{in_place ? input : input.clone()};
  auto work = all_reduce(tensors, op);
  const int64_t n = output.numel();
  at::Tensor chunk = tensors[0].reshape({-1}).narrow(0, config_->rank * n, n).view(output.sizes());
  // An output that is this rank's chunk of the input (in place) is already the result.
  if (in_place && chunk.data_ptr() == output.data_ptr())
    return then_work(std::move(work), nullptr, {output});
  return copy_after_work(std::move(work), std::move(chunk), output);
}

std::shared_ptr<PendingWork> Comm::all_gather_by_views(at::Tensor& output, at::Tensor& input) {
  const int64_t n = input.numel();
  if (n == 0) return done_work({output});
  std::vector<std::vector<at::Tensor>> outputs(1);
  const at::Tensor flat = output.view({-1});
  for (int r = 0; r < config_->world_size; ++r) {
    outputs[0].push_back(flat.narrow(0, r * n, n).view(input.sizes()));
  }
  std::vector<at::Tensor> inputs{input};
  return all_gather(outputs, inputs);
}

std::shared_ptr<PendingWork> Comm::reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                         ReduceOp op) {
  check_flat("reduce_scatter_tensor", input, output);
  return reduce_scatter_by_all_reduce(output, input, op);
}

std::shared_ptr<PendingWork> Comm::all_gather_into_tensor(at::Tensor& output, at::Tensor& input) {
  check_flat("all_gather_into_tensor", output, input);
  return all_gather_by_views(output, input);
}

std::vector<at::Tensor> Comm::allocate_buffers(const std::vector<int64_t>& numels,
                                               const std::vector<at::TensorOptions>& options) {
  TORCH_INTERNAL_ASSERT(numels.size() == options.size());
  std::vector<at::Tensor> buffers;
  buffers.reserve(numels.size());
  for (size_t i = 0; i < numels.size(); ++i) buffers.push_back(at::zeros({numels[i]}, options[i]));
  return buffers;
}

bool Comm::reduces_in_place(c10::ScalarType, size_t) const { return false; }

std::shared_ptr<PendingWork> Comm::all_reduce_in_place(std::vector<at::Tensor>&, double) {
  TORCH_INTERNAL_ASSERT(false, "all_reduce_in_place on a ", config().backend,
                        " group, which does not reduce in place (reduces_in_place is false)");
}

}  // namespace detail
}  // namespace ddp
