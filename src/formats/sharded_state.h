#pragma once

// Note [Sharded optimizers in checkpoints]
// An optimizer whose state is spread over the ranks (ZeroRedundancyOptimizer) is saved
// as the unsharded optimizer's state, so that the file is the same as without sharding:
// Python reads it, a plain optimizer resumes from it, and a sharded one resumes from it
// with any number of ranks. Checkpoint::optimizer(ZeroRedundancyOptimizer*) attaches
// this interface; save_checkpoint has every rank call gather() (it is collective) before
// rank 0 writes, and load_checkpoint takes prepare_load() instead of the plain
// optimizer's. Only this header is shared, so the checkpoint code does not link the
// optimizer's.

#include "formats/pickle_io.h"

#include <ATen/core/Dict.h>

#include <optional>
#include <string>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace ddp {
namespace detail {

class ShardedOptimizerState {
 public:
  virtual ~ShardedOptimizerState() = default;
  /// Collective over the optimizer's group. On its rank 0: the unsharded optimizer's
  /// state dict (optimizer_state_dict's layout, names from `model`); nullopt elsewhere.
  virtual std::optional<c10::impl::GenericDict> gather(const torch::nn::Module& model) = 0;
  /// Validates `saved` (an unsharded optimizer's state) for this rank's shard and
  /// returns its load. Not collective.
  virtual Apply prepare_load(const torch::nn::Module& model, const c10::IValue& saved,
                             const std::string& where) = 0;
};

}  // namespace detail
}  // namespace ddp
