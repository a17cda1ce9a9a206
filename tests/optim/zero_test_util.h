#pragma once

// Models, data and optimizers shared by the ZeroRedundancyOptimizer tests. The
// reference for ZeRO is always the same training with the unsharded optimizer.

#include "support/harness.h"
#include "support/util.h"

#include <ddp/parallel/distributed_data_parallel.h>
#include <ddp/errors.h>
#include <ddp/optim/zero_redundancy_optimizer.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>
#include <vector>

namespace zero_test {

/// Layers of unequal sizes, so that the partition has something to balance.
struct WideImpl : torch::nn::Module {
  explicit WideImpl(int64_t width = 32)
      : fc1(register_module("fc1", torch::nn::Linear(8, width))),
        fc2(register_module("fc2", torch::nn::Linear(width, width))),
        fc3(register_module("fc3", torch::nn::Linear(width, width / 2))),
        fc4(register_module("fc4", torch::nn::Linear(width / 2, 4))) {}
  at::Tensor forward(const at::Tensor& x) {
    return fc4(at::tanh(fc3(at::relu(fc2(at::relu(fc1(x)))))));
  }
  torch::nn::Linear fc1, fc2, fc3, fc4;
};
TORCH_MODULE(Wide);

/// A model whose parameters are N(0, 0.3^2) from a private generator (thread-safe).
inline Wide make_wide(uint64_t seed, int64_t width = 32) {
  Wide model(width);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.3);
  return model;
}

/// Rank `rank`'s batch at step `step`: the same on every rerun.
inline std::pair<at::Tensor, at::Tensor> batch(int rank, int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * (step + 1) + rank);
  return {at::randn({6, 8}, gen), at::randn({6, 4}, gen)};
}

/// The wrapped optimizer's options for `kind`: "sgd" (momentum), "adam", "adamw",
/// "amsgrad".
template <typename F>
auto with_options(const std::string& kind, F&& f) {
  if (kind == "sgd") {
    return f(torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
  }
  if (kind == "adamw") return f(torch::optim::AdamWOptions(0.01).weight_decay(0.05));
  if (kind == "amsgrad") return f(torch::optim::AdamOptions(0.01).amsgrad(true));
  return f(torch::optim::AdamOptions(0.01).weight_decay(1e-4));
}

inline std::unique_ptr<torch::optim::Optimizer> make_plain(const std::string& kind,
                                                           std::vector<at::Tensor> params) {
  return with_options(kind, [&](const auto& options) {
    using Options = std::decay_t<decltype(options)>;
    using Optimizer = typename ddp::OptimizerFor<Options>::type;
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<Optimizer>(std::move(params), options));
  });
}

inline std::unique_ptr<ddp::ZeroRedundancyOptimizer> make_zero(
    const std::string& kind, std::vector<at::Tensor> params,
    const ddp::ZeroRedundancyOptimizerOptions& zero_options) {
  return with_options(kind, [&](const auto& options) {
    return std::make_unique<ddp::ZeroRedundancyOptimizer>(std::move(params), options, zero_options);
  });
}

/// The gradients of one training step of a DDP model with `opt`, on rank's batch of
/// `step`: zero_grad, forward and backward, without the optimizer's step.
template <typename Model>
void backward_step(Model& dmodel, torch::optim::Optimizer& opt, int rank, int64_t step) {
  const auto b = batch(rank, step);
  opt.zero_grad();
  torch::mse_loss(dmodel->forward(b.first), b.second).backward();
}

/// One training step of a DDP model with `opt`, on rank's batch of `step`.
template <typename Model>
void train_step(Model& dmodel, torch::optim::Optimizer& opt, int rank, int64_t step) {
  backward_step(dmodel, opt, rank, step);
  opt.step();
}

/// Expects every parameter of `a` to have the bits of `b`'s, naming the first that
/// differs and by how much.
inline void expect_same_params(const torch::nn::Module& a, const torch::nn::Module& b,
                               const std::string& what) {
  const auto pa = a.named_parameters();
  const auto pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(ddp_test::same_bits(pa[i].value(), pb[i].value()))
        << what << ": " << pa[i].key() << " differs by up to "
        << ddp_test::max_diff(pa[i].value(), pb[i].value());
  }
}

/// The name of the first parameter whose tensor (`what` of it: its value or its
/// gradient) differs in bits between `a` and `b`, or "" when none does.
inline std::string first_difference(const torch::nn::Module& a, const torch::nn::Module& b,
                                    bool grads) {
  const auto pa = a.named_parameters();
  const auto pb = b.named_parameters();
  for (size_t i = 0; i < pa.size() && i < pb.size(); ++i) {
    const at::Tensor x = grads ? pa[i].value().grad() : pa[i].value();
    const at::Tensor y = grads ? pb[i].value().grad() : pb[i].value();
    if (x.defined() != y.defined() || (x.defined() && !ddp_test::same_bits(x, y))) {
      return pa[i].key();
    }
  }
  return "";
}

/// Expects every rank of `pg` to hold the same bits in every parameter of `m`.
inline void expect_same_on_every_rank(ddp::ProcessGroup& pg, const torch::nn::Module& m) {
  for (const auto& p : m.named_parameters()) {
    const auto all = pg.all_gather(p.value().detach().contiguous());
    for (size_t r = 1; r < all.size(); ++r) {
      EXPECT_TRUE(ddp_test::same_bits(all[0], all[r])) << p.key() << " differs on rank " << r;
    }
  }
}

}  // namespace zero_test
