#pragma once

// ZeroRedundancyOptimizer's state in the unsharded optimizer's layout: gathered for a
// save, split again for a load.

#include <ddp/optim/zero_redundancy_optimizer.h>

#include "formats/pickle_io.h"
#include "formats/sharded_state.h"

#include <memory>
#include <optional>
#include <string>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace ddp {
namespace detail {

/// Collective. On `to_rank`: the unsharded optimizer's state in Python's
/// optimizer.state_dict() layout plus "type" and "param_names" (all empty: the caller
/// knows the model); nullopt on the other ranks. Note [ZeRO state exchange].
std::optional<c10::impl::GenericDict> gather_zero_state(ZeroRedundancyOptimizer& zero, int to_rank);

/// Checks `saved`, an unsharded optimizer's state, against `zero` (param groups,
/// parameter counts, then this rank's shard: type, names where `model` has them, shapes)
/// and returns the load of this rank's shard and of the hyperparameters.
Apply prepare_zero_load(ZeroRedundancyOptimizer& zero, const torch::nn::Module& model,
                        const c10::IValue& saved, const std::string& where);

/// The ShardedOptimizerState through which a checkpoint saves and loads `zero` (Note
/// [Sharded optimizers in checkpoints]). `zero` must outlive it.
std::shared_ptr<ShardedOptimizerState> make_zero_checkpoint_state(ZeroRedundancyOptimizer& zero);

}  // namespace detail
}  // namespace ddp
