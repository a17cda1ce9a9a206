#pragma once

// Helpers shared by the mixed-precision tests.

#include "support/util.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <limits>
#include <string>
#include <vector>

namespace ddp_test {

/// One parameter `w`; forward(c) = sum(w * c), so backward of scale * forward(c) leaves
/// w.grad = scale * c exactly (one multiplication): a gradient the test chooses.
struct PlantedGradImpl : torch::nn::Module {
  explicit PlantedGradImpl(const at::Tensor& init) { w = register_parameter("w", init.clone()); }
  at::Tensor forward(const at::Tensor& c) { return (w * c).sum(); }
  at::Tensor w;
};
TORCH_MODULE(PlantedGrad);

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// Every parameter of `m`, flattened and concatenated (detached copy).
inline at::Tensor flat_parameters(torch::nn::Module& m) {
  std::vector<at::Tensor> all;
  for (const auto& p : m.parameters()) all.push_back(p.detach().reshape({-1}));
  return at::cat(all).clone();
}

/// Whether any gradient of `m` holds an inf or a NaN.
inline bool any_non_finite_grad(torch::nn::Module& m) {
  for (const auto& p : m.parameters()) {
    if (p.grad().defined() && !p.grad().isfinite().all().item<bool>()) return true;
  }
  return false;
}

}  // namespace ddp_test
