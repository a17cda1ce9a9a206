// ZeroRedundancyOptimizer in checkpoints (Note [Sharded optimizers in checkpoints]).

#include <ddp/optim/zero_redundancy_optimizer.h>

#include "distributed/common/check.h"
#include "formats/sharded_state.h"
#include "optim/zero_state.h"

#include <torch/nn/module.h>

#include <unordered_map>

namespace ddp {
namespace detail {
namespace {

class ZeroCheckpointState final : public ShardedOptimizerState {
 public:
  explicit ZeroCheckpointState(ZeroRedundancyOptimizer& zero) : zero_(zero) {}

  std::optional<c10::impl::GenericDict> gather(const torch::nn::Module& model) override {
    std::optional<c10::impl::GenericDict> state = gather_zero_state(zero_, /*to_rank=*/0);
    if (!state) return state;
    std::unordered_map<const c10::TensorImpl*, std::string> names;
    for (const auto& p : model.named_parameters(/*recurse=*/true)) {
      names.emplace(p.value().unsafeGetTensorImpl(), p.key());
    }
    c10::impl::GenericList param_names = new_list();
    for (const auto& group : zero_.param_groups()) {
      for (const auto& p : group.params()) {
        const auto it = names.find(p.unsafeGetTensorImpl());
        param_names.push_back(it == names.end() ? std::string() : it->second);
      }
    }
    state->insert_or_assign("param_names", param_names);
    return state;
  }

  Apply prepare_load(const torch::nn::Module& model, const c10::IValue& saved,
                     const std::string& where) override {
    return prepare_zero_load(zero_, model, saved, where);
  }

 private:
  ZeroRedundancyOptimizer& zero_;
};

}  // namespace

std::shared_ptr<ShardedOptimizerState> make_zero_checkpoint_state(ZeroRedundancyOptimizer& zero) {
  return std::make_shared<ZeroCheckpointState>(zero);
}

}  // namespace detail

}  // namespace ddp
