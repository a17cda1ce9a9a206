#pragma once

// The benchmark's models, their deterministic initialisation and synthetic data:
// the C++ twin of models.py, which documents the formulas. The two must stay in step;
// run.py checks that they do by training both and comparing every parameter.

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <utility>
#include <vector>

namespace bench {

constexpr int64_t kNumClasses = 10;
constexpr int kNumBatches = 4;  // distinct batches per rank, generated before timing

struct ModelSpec {
  int64_t batch;               // per rank
  std::vector<int64_t> input;  // one sample's shape
};

/// The GPT's sizes (model "gpt"): examples/gpt's defaults, a vocabulary of 96 characters.
constexpr int64_t kGptVocab = 96, kGptBlock = 64;

/// small, cnn, wide, tiny or gpt; throws on any other name.
ModelSpec spec(const std::string& name);

/// The model with its closed-form initial weights.
torch::nn::Sequential build(const std::string& name);

/// kNumBatches (input, label) pairs for `rank`.
std::vector<std::pair<at::Tensor, at::Tensor>> batches(const std::string& name, int rank);

}  // namespace bench
