#pragma once

// The small model, data, optimizers and checks shared by the checkpoint tests (and by
// optim/zero_python_test.cpp, which reuses the model and its Python twin).

#include "support/harness.h"
#include "support/util.h"

#include <ddp/serialize/checkpoint.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/data.h>
#include <torch/nn.h>
#include <torch/optim.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp_test {

/// A small convolutional net with buffers (BatchNorm) and a child Sequential, named
/// like its Python twin in tests/serialize/python/checkpoint_reference.py.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(4))),
        head(register_module("head",
                             torch::nn::Sequential(torch::nn::Linear(4 * 4 * 4, 8),
                                                   torch::nn::ReLU(), torch::nn::Linear(8, 3)))) {}
  at::Tensor forward(at::Tensor x) {
    x = torch::relu(bn1(conv1(x)));
    return head->forward(x.flatten(1));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Sequential head;
};
TORCH_MODULE(Net);

// Fixed, step-dependent data: a rerun of step s sees the same batch.
inline std::pair<at::Tensor, at::Tensor> batch_for(int64_t step) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  return {at::randn({4, 1, 6, 6}, gen), at::randn({4, 3}, gen)};
}

inline void train(Net& net, torch::optim::Optimizer& opt, int64_t from, int64_t to) {
  for (int64_t s = from; s < to; ++s) {
    const auto b = batch_for(s);
    opt.zero_grad();
    torch::mse_loss(net->forward(b.first), b.second).backward();
    opt.step();
  }
}

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, Net& net,
                                                               double lr) {
  if (kind == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        net->parameters(), torch::optim::SGDOptions(lr).momentum(0.9).weight_decay(1e-4));
  }
  if (kind == "adam") {
    return std::make_unique<torch::optim::Adam>(net->parameters(),
                                                torch::optim::AdamOptions(lr).weight_decay(1e-4));
  }
  if (kind == "amsgrad") {
    return std::make_unique<torch::optim::Adam>(net->parameters(),
                                                torch::optim::AdamOptions(lr).amsgrad(true));
  }
  return std::make_unique<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(lr));
}

inline Net make_net(uint64_t seed) {
  torch::manual_seed(seed);
  return Net();
}

// Copies of every tensor of the model's state dict.
inline std::vector<at::Tensor> snapshot(const torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& e : ddp::model_state_dict(m)) out.push_back(e.value().clone());
  return out;
}

inline bool unchanged(const torch::nn::Module& m, const std::vector<at::Tensor>& before) {
  const auto now = ddp::model_state_dict(m);
  size_t i = 0;
  for (const auto& e : now) {
    if (!same_bits(e.value(), before[i++])) return false;
  }
  return i == before.size();
}

inline void expect_same_model(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto da = ddp::model_state_dict(a);
  const auto db = ddp::model_state_dict(b);
  ASSERT_EQ(da.size(), db.size());
  for (const auto& e : da) {
    EXPECT_TRUE(same_bits(e.value(), db.at(e.key()))) << e.key() << " differs";
  }
}

}  // namespace ddp_test
