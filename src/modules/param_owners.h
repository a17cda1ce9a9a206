#pragma once

// Who holds a parameter: a fully_shard unit (which shards it) or a DistributedDataParallel
// (which replicates it). Each refuses the other's parameters, and activation
// checkpointing refuses a checkpoint around a unit; this registry lets them ask without
// knowing each other's types.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <string>

namespace ddp {
namespace detail {

/// What a fully_shard unit says of itself to the parts that only need to know.
class ShardOwner {
 public:
  virtual ~ShardOwner() = default;
  /// The unit's module name, for messages.
  virtual const std::string& name() const = 0;
  /// Whether its parameters are full now (between its all-gather and its reshard).
  virtual bool unsharded() const = 0;
  /// The module that stands for the unit in its tree (fully_shard's wrapper).
  virtual const torch::nn::Module* module() const = 0;
};

/// Which unit shards this tensor, or nullptr (an unsharded parameter).
ShardOwner* shard_owner_of(const at::Tensor& param);
void register_shard_owner(const at::Tensor& param, ShardOwner* owner);
void unregister_shard_owner(const at::Tensor& param);

/// DistributedDataParallel's parameters, which fully_shard refuses (and the reverse): a
/// count per tensor (a parameter under two DDPs is marked twice).
void mark_ddp_param(const at::Tensor& param, bool owned);
bool is_ddp_param(const at::Tensor& param);

}  // namespace detail
}  // namespace ddp
