#pragma once

#include "formats/pickle_io.h"

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <string>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace ddp {
namespace detail {

/// Checks that `state` fits the model (same keys, same shapes) and returns the copy
/// to perform; throws, listing every missing/unexpected key and shape mismatch.
Apply prepare_model_load(torch::nn::Module& model, const c10::Dict<std::string, at::Tensor>& state,
                         const std::string& where);

/// model_state_dict with every tensor on the CPU (what a file holds; see cpu_copy).
c10::Dict<std::string, at::Tensor> cpu_state_dict(const torch::nn::Module& model);

}  // namespace detail
}  // namespace ddp
