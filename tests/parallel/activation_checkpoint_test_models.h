#pragma once

// The models of the activation checkpointing tests: a residual MLP block with LayerNorm
// and dropout (the same as tests/parallel/python/checkpoint_peer.py's), and the fully_shard
// tests' small transformer.

#include "parallel/ddp_test_util.h"
#include "parallel/fsdp_test_models.h"

#include <ddp/algorithms/activation_checkpoint.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

namespace ddp_test {

constexpr int64_t kDropDim = 8;

/// x + fc2(dropout(gelu(fc1(ln(x))))), dropout p in training. Counts its forwards.
struct DropBlockImpl : torch::nn::Module {
  explicit DropBlockImpl(double p = 0.3)
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDropDim})))),
        fc1(register_module("fc1", torch::nn::Linear(kDropDim, 4 * kDropDim))),
        fc2(register_module("fc2", torch::nn::Linear(4 * kDropDim, kDropDim))),
        p(p) {}
  at::Tensor forward(at::Tensor x) {
    ++calls;
    return x + fc2(at::dropout(at::gelu(fc1(ln(x))), p, is_training()));
  }
  torch::nn::LayerNorm ln;
  torch::nn::Linear fc1, fc2;
  double p;
  int calls = 0;
};

}  // namespace ddp_test
