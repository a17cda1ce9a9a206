#pragma once

// ZeRO stage 1: an optimizer whose state is split across the ranks of a group, as
// torch.distributed.optim.ZeroRedundancyOptimizer does. Each rank keeps the optimizer
// state (Adam's exp_avg and exp_avg_sq, SGD's momentum) of its own shard of the
// parameters only, steps that shard, and then every rank receives the updated
// parameters of every shard. Gradients must already be averaged across ranks, as
// DistributedDataParallel does in backward.
//
// Example (every rank runs this):
//   auto dmodel = ddp::DistributedDataParallel(model);
//   ddp::ZeroRedundancyOptimizer optimizer(model->parameters(),
//                                          torch::optim::AdamOptions(1e-3));
//   for (auto& batch : *loader) {
//     optimizer.zero_grad();
//     torch::mse_loss(dmodel->forward(batch.data), batch.target).backward();
//     optimizer.step();                   // steps this rank's shard, then syncs all
//   }
//   ddp::Checkpoint(*model).optimizer(&optimizer);  // saved like an unsharded Adam
//
// See docs/zero.md for the partition, the collectives and the checkpoint format.

#include <ddp/distributed/process_group.h>

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace ddp {

/// The optimizer type that steps a shard, given its options type. Specialise it for
/// an optimizer of your own whose state is per parameter (each parameter's update reads
/// only that parameter's gradient and state). LBFGS has no specialisation: its state
/// (the curvature history) spans all parameters, so it cannot be split.
template <typename Options>
struct OptimizerFor {};
template <>
struct OptimizerFor<torch::optim::SGDOptions> {
  using type = torch::optim::SGD;
};
template <>
struct OptimizerFor<torch::optim::AdamOptions> {
  using type = torch::optim::Adam;
};
template <>
struct OptimizerFor<torch::optim::AdamWOptions> {
  using type = torch::optim::AdamW;
};
template <>
struct OptimizerFor<torch::optim::AdagradOptions> {
  using type = torch::optim::Adagrad;
};
template <>
struct OptimizerFor<torch::optim::RMSpropOptions> {
  using type = torch::optim::RMSprop;
};

/// How every rank receives the parameters that other ranks stepped (docs/zero.md has
/// measurements).
enum class ParameterSync {
  /// One broadcast per rank of its shard, packed flat (world_size collectives per
  /// dtype, all in flight at once), as PyTorch does. The faster on Gloo.
  kBroadcast,
  /// One all-gather per dtype of a flat buffer (each rank's shard, padded to the
  /// largest shard): one collective per step.
  kAllGather,
};

/// Options of ZeroRedundancyOptimizer itself; the wrapped optimizer's go beside them.
///
/// Example:
///   ddp::ZeroRedundancyOptimizerOptions().process_group(pg)
///       .parameter_sync(ddp::ParameterSync::kAllGather);
struct ZeroRedundancyOptimizerOptions {
  /// The group to shard over; nullptr: the default group (ddp::init_process_group
  /// must have been called).
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
  /// How the stepped parameters reach every rank.
  TORCH_ARG(ParameterSync, parameter_sync) = ParameterSync::kBroadcast;
};

namespace detail {
/// Builds the wrapped optimizer over one rank's shard of the param groups.
using ShardOptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    const std::vector<torch::optim::OptimizerParamGroup>&)>;
template <typename Options, typename = void>
struct HasOptimizerFor : std::false_type {};
template <typename Options>
struct HasOptimizerFor<Options, std::void_t<typename OptimizerFor<Options>::type>>
    : std::true_type {};
}  // namespace detail

/// An optimizer that keeps 1/world_size of the optimizer state on each rank.
///
/// Construction is collective: the ranks check that they hold the same parameters
/// (count, order, shapes, dtypes), and throw MismatchError naming the first rank and
/// parameter that differ. The partition follows PyTorch's: per param group, parameters
/// sorted by numel (largest first) each go to the rank with the fewest elements so far.
///
/// param_groups() hold every parameter with the wrapped optimizer's options, as in
/// PyTorch: change lr there (an LR scheduler does); step() passes the options on to the
/// shard's optimizer. zero_grad() clears every parameter's gradient. state() of this
/// object is empty: the state lives in local_optimizer().
class ZeroRedundancyOptimizer : public torch::optim::Optimizer {
 public:
  /// Shards `param_groups` over the group; `defaults` (e.g. AdamOptions(1e-3)) picks
  /// the wrapped optimizer type (OptimizerFor) and fills groups without options.
  template <typename OptimizerOptions>
  ZeroRedundancyOptimizer(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                          const OptimizerOptions& defaults,
                          ZeroRedundancyOptimizerOptions options = {})
      : ZeroRedundancyOptimizer(param_groups, std::make_unique<OptimizerOptions>(defaults),
                                factory_for(defaults), std::move(options)) {}

  template <typename OptimizerOptions>
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, const OptimizerOptions& defaults,
                          ZeroRedundancyOptimizerOptions options = {})
      : ZeroRedundancyOptimizer(
            std::vector<torch::optim::OptimizerParamGroup>{
                torch::optim::OptimizerParamGroup(std::move(params))},
            defaults, std::move(options)) {}

  ~ZeroRedundancyOptimizer() override;

  /// Steps this rank's shard with the wrapped optimizer, then brings every rank's
  /// parameters up to date (ParameterSync). Collective. Returns the closure's loss.
  at::Tensor step(LossClosure closure = nullptr) override;

  /// Gathers the full optimizer state on rank `to_rank` of the group, for state_dict().
  /// Collective; the other ranks hold no copy. As PyTorch's consolidate_state_dict.
  void consolidate_state_dict(int to_rank = 0);

  /// On the rank consolidate_state_dict gathered to: the state of the unsharded
  /// optimizer, in Python's optimizer.state_dict() layout ("state" keyed by parameter
  /// index over all param groups, "param_groups" with the hyperparameters) plus "type".
  /// Throws elsewhere, or after a step() since the consolidation.
  c10::impl::GenericDict state_dict() const;

  /// Loads the state of an unsharded optimizer (state_dict()'s layout, or a plain
  /// optimizer's saved by ddp::save_checkpoint) of the same type and parameters: each
  /// rank keeps its own shard's, so a state saved with any number of ranks loads.
  /// Validates everything first and throws naming what differs; not collective.
  void load_state_dict(const c10::impl::GenericDict& state);

  /// The optimizer that steps this rank's shard (its param groups are this rank's parts
  /// of param_groups(), some possibly empty).
  torch::optim::Optimizer& local_optimizer() { return *local_; }
  const torch::optim::Optimizer& local_optimizer() const { return *local_; }

  /// For each parameter (param groups flattened in order), the rank that steps it.
  const std::vector<int>& owners() const { return owners_; }
  /// The group the state is sharded over.
  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }

  /// Bytes of optimizer state this rank holds (optimizer_state_bytes of
  /// local_optimizer()).
  int64_t local_state_bytes() const;

  /// Not supported: the state is spread over ranks. Use ddp::save_checkpoint with
  /// Checkpoint::optimizer(&this_optimizer), or consolidate_state_dict + state_dict.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  ZeroRedundancyOptimizer(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                          std::unique_ptr<torch::optim::OptimizerOptions> defaults,
                          detail::ShardOptimizerFactory factory,
                          ZeroRedundancyOptimizerOptions options);

  template <typename OptimizerOptions>
  static detail::ShardOptimizerFactory factory_for(const OptimizerOptions& defaults) {
    static_assert(detail::HasOptimizerFor<OptimizerOptions>::value,
                  "ZeroRedundancyOptimizer shards optimizers whose state is per parameter: "
                  "SGD, Adam, AdamW, Adagrad and RMSprop (ddp::OptimizerFor names them). "
                  "LBFGS keeps one history for all parameters and cannot be sharded; for "
                  "an optimizer of your own, specialise ddp::OptimizerFor<ItsOptions>.");
    if constexpr (detail::HasOptimizerFor<OptimizerOptions>::value) {
      using Optimizer = typename OptimizerFor<OptimizerOptions>::type;
      return [defaults](const std::vector<torch::optim::OptimizerParamGroup>& groups) {
        return std::unique_ptr<torch::optim::Optimizer>(
            std::make_unique<Optimizer>(groups, defaults));
      };
    } else {
      return nullptr;
    }
  }

  void check_same_parameters_everywhere() const;
  void pass_options_to_shard();
  void sync_parameters();

  std::shared_ptr<ProcessGroup> group_;
  ZeroRedundancyOptimizerOptions options_;
  std::vector<int> owners_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  std::optional<c10::impl::GenericDict> consolidated_;
  struct SyncPlan;
  std::unique_ptr<SyncPlan> sync_;
};

/// Bytes of the tensors in an optimizer's per-parameter state (SGD's momentum_buffer,
/// Adam's and AdamW's exp_avg, exp_avg_sq and max_exp_avg_sq, Adagrad's sum, RMSprop's
/// square_avg, momentum_buffer and grad_avg); 0 for state of another type.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace ddp
