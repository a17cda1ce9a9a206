#include "parallel/grad_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace ddp {
namespace detail {

GradHooks::GradHooks(const std::vector<at::Tensor>& params, OnReady on_ready) {
  using torch::autograd::variable_list;
  auto shared = std::make_shared<OnReady>(std::move(on_ready));
  accumulators_.reserve(params.size());
  keys_.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    TORCH_INTERNAL_ASSERT(acc, "parameter ", i,
                          " has no gradient accumulator (not a leaf "
                          "that requires grad; DistributedDataParallel checks this first)");
    const uintptr_t key =
        acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [shared, i](const variable_list& outputs, const variable_list& /*inputs*/) {
              (*shared)(i);
              return outputs;
            }));
    accumulators_.push_back(std::move(acc));
    keys_.push_back(key);
  }
}

bool GradHooks::hooked(const at::Tensor& param, size_t i) const {
  return torch::autograd::impl::try_get_grad_accumulator(param).get() == accumulators_[i].get();
}

namespace {

class OutputPreHook final : public torch::autograd::FunctionPreHook {
 public:
  OutputPreHook(std::weak_ptr<OutputListener> listener, uint64_t forward_id)
      : listener_(std::move(listener)), forward_id_(forward_id) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (auto listener = listener_.lock()) listener->on_output_grad(forward_id_);
    return grads;
  }

 private:
  std::weak_ptr<OutputListener> listener_;
  uint64_t forward_id_;
};

}  // namespace

void hook_output_nodes(const std::vector<at::Tensor>& outputs,
                       const std::weak_ptr<OutputListener>& listener, uint64_t forward_id) {
  for (const at::Tensor& out : outputs) {
    if (const auto& node = out.grad_fn()) {
      node->add_pre_hook(std::make_unique<OutputPreHook>(listener, forward_id));
    }
  }
}

GradHooks::~GradHooks() {
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    accumulators_[i]->del_post_hook(keys_[i]);
  }
}

}  // namespace detail
}  // namespace ddp
