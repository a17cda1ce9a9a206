#include "parallel/grad_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
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
    TORCH_INTERNAL_ASSERT(acc, "parameter ", i, " has no gradient accumulator");
    const uintptr_t key = acc->add_post_hook(
        std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [shared, i](const variable_list& outputs, const variable_list& /*inputs*/) {
              (*shared)(i);
              return outputs;
            }));
    accumulators_.push_back(std::move(acc));
    keys_.push_back(key);
  }
}

GradHooks::~GradHooks() {
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    accumulators_[i]->del_post_hook(keys_[i]);
  }
}

} // namespace detail
} // namespace ddp
