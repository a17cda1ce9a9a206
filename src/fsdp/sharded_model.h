#pragma once

// Note [Sharded models in checkpoints]
// A model under ddp::fully_shard holds only its rows of each parameter, and its
// optimizer only their state. A checkpoint of it is still the unsharded model's: every
// rank takes part in gathering the full parameters and the full optimizer state (rows
// put together across the unit's group) to rank 0, which writes the usual file, so
// Python's torch.load reads it and a plain model, DDP or ZeRO resumes from it. Loading
// is local: each rank cuts its rows out of the full tensors, for whatever world size it
// now runs at, then validates and applies them as for any model.

#include "formats/pickle_io.h"

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace ddp {
namespace detail {

/// Whether any parameter of `model` is sharded by fully_shard.
bool model_is_sharded(const torch::nn::Module& model);

/// Collective over the units' group: optimizer_state_dict's layout with every state
/// tensor of a sharded parameter gathered to its full shape. Meaningful on rank 0.
c10::impl::GenericDict gather_optimizer_state(const torch::optim::Optimizer& optimizer,
                                              const torch::nn::Module& model);

/// `state` (full tensors, from a file) with each sharded parameter's entry cut to this
/// rank's rows. Keys that name no sharded parameter are kept as they are.
c10::Dict<std::string, at::Tensor> shard_model_state(
    const torch::nn::Module& model, const c10::Dict<std::string, at::Tensor>& state);

/// A saved optimizer state (full shapes) with each sharded parameter's state tensors cut
/// to this rank's rows.
c10::IValue shard_optimizer_state(const torch::optim::Optimizer& optimizer,
                                  const c10::IValue& saved);

}  // namespace detail
}  // namespace ddp
