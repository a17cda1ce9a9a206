#pragma once

// LibTorch optimizers <-> Python's optimizer.state_dict() layout.

#include "formats/pickle_io.h"

#include <string>

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

/// {"state": {index: {...}}, "param_groups": [{..., "params": [index, ...]}],
///  "type": "SGD", "param_names": [model key per index]} with CPU tensors.
/// Supports torch::optim::SGD, Adam and AdamW; throws for others.
c10::impl::GenericDict optimizer_state_dict(const torch::optim::Optimizer& optimizer,
                                            const torch::nn::Module& model);

/// Checks `saved` against the optimizer (type, groups, parameter counts, names, state
/// shapes) and returns the restore to perform; throws naming what differs.
Apply prepare_optimizer_load(torch::optim::Optimizer& optimizer, const torch::nn::Module& model,
                             const c10::IValue& saved, const std::string& where);

}  // namespace detail
}  // namespace ddp
