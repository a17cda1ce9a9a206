#pragma once

// Models, data and references shared by the DistributedDataParallel tests.
//
// Every expectation is computed independently of DDP: single-process LibTorch on the
// whole (concatenated) batch, or per-shard where the maths requires it.

#include "support/harness.h"
#include "support/util.h"

#include <ddp/parallel/distributed_data_parallel.h>
#include <ddp/errors.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp_test {

inline ddp::DistributedDataParallelOptions options_for(ddp::ProcessGroup& pg) {
  return ddp::DistributedDataParallelOptions().process_group(borrow(pg));
}

/// Overwrites every parameter with N(0, 0.3^2) values from a private generator seeded
/// with `seed` (thread-safe, unlike the global generator).
inline void init_params(torch::nn::Module& m, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.3);
}

inline at::Tensor randn(at::IntArrayRef sizes, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(sizes, gen);
}

// ---- Models ------------------------------------------------------------------------

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t in = 8, int64_t hidden = 16, int64_t out = 4)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, out))) {}
  at::Tensor forward(const at::Tensor& x) { return fc3(at::relu(fc2(at::relu(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

struct CnnImpl : torch::nn::Module {
  CnnImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)))),
        fc(register_module("fc", torch::nn::Linear(4 * 3 * 3, 4))) {}
  // x: [N, 1, 8, 8] -> conv 6x6 -> pool 3x3 -> [N, 36] -> [N, 4]
  at::Tensor forward(const at::Tensor& x) {
    auto h = at::max_pool2d(at::relu(conv(x)), {2, 2});
    return fc(h.flatten(1));
  }
  torch::nn::Conv2d conv;
  torch::nn::Linear fc;
};
TORCH_MODULE(Cnn);

/// Two heads; forward adds head b only when use_b is set (set per rank in tests).
struct BranchNetImpl : torch::nn::Module {
  BranchNetImpl()
      : trunk(register_module("trunk", torch::nn::Linear(8, 16))),
        head_a(register_module("head_a", torch::nn::Linear(16, 4))),
        head_b(register_module("head_b", torch::nn::Linear(16, 4))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto h = at::relu(trunk(x));
    auto y = head_a(h);
    return use_b ? y + head_b(h) : y;
  }
  torch::nn::Linear trunk, head_a, head_b;
  bool use_b = false;
};
TORCH_MODULE(BranchNet);

/// Two heads on one trunk; `heads` ("a", "b" or "ab", set per rank in tests) says which
/// heads forward uses.
struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl()
      : trunk(register_module("trunk", torch::nn::Linear(8, 16))),
        head_a(register_module("head_a", torch::nn::Linear(16, 4))),
        head_b(register_module("head_b", torch::nn::Linear(16, 4))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::relu(trunk(x));
    if (heads == "a") return head_a(h);
    if (heads == "b") return head_b(h);
    return head_a(h) + head_b(h);
  }
  torch::nn::Linear trunk, head_a, head_b;
  std::string heads = "ab";
};
TORCH_MODULE(TwoHeads);

struct BnNetImpl : torch::nn::Module {
  BnNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 16))),
        bn(register_module("bn", torch::nn::BatchNorm1d(16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(at::relu(bn(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Linear fc2;
};
TORCH_MODULE(BnNet);

// ---- Data and references -------------------------------------------------------------

/// Rows [rank * per_rank, (rank + 1) * per_rank) of x.
inline at::Tensor shard(const at::Tensor& x, int rank, int64_t per_rank) {
  return x.narrow(0, rank * per_rank, per_rank);
}

inline at::Tensor mse(const at::Tensor& out, const at::Tensor& target) {
  return at::mse_loss(out, target);  // mean over the elements
}

/// Gradients of `m` (cloned, in parameters() order), zeroing them first.
inline std::vector<at::Tensor> grads_after(torch::nn::Module& m,
                                           const std::function<at::Tensor()>& loss) {
  for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
  loss().backward();
  std::vector<at::Tensor> g;
  for (auto& p : m.parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : p.grad());
  return g;
}

/// The reference of every DDP gradient test: the gradients, in one process, of the loss
/// over the whole batch, for a copy of the model (`ref`, initialised here with `seed`).
/// After one DDP backward of the same loss over its shard, every rank must hold these
/// (see the top of ddp_gradients_test.cpp for why).
template <typename Net>
std::vector<at::Tensor> full_batch_grads(Net ref, uint64_t seed, const at::Tensor& x,
                                         const at::Tensor& y) {
  init_params(*ref, seed);
  return grads_after(*ref, [&] { return mse(ref->forward(x), y); });
}

inline std::vector<at::Tensor> current_grads(torch::nn::Module& m) {
  std::vector<at::Tensor> g;
  for (auto& p : m.parameters()) g.push_back(p.grad());
  return g;
}

/// ||a - b|| / ||b||, the relative error used throughout (robust to entries near 0).
inline double rel_error(const at::Tensor& a, const at::Tensor& b) {
  const double denom = b.norm().item<double>();
  const double diff = (a - b).norm().item<double>();
  return denom == 0 ? diff : diff / denom;
}

inline void expect_grads_close(const std::vector<at::Tensor>& got,
                               const std::vector<at::Tensor>& want, double rtol,
                               const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].defined(), want[i].defined()) << what << ": gradient #" << i;
    if (!want[i].defined()) continue;
    EXPECT_LE(rel_error(got[i], want[i]), rtol) << what << ": gradient #" << i;
  }
}

}  // namespace ddp_test
