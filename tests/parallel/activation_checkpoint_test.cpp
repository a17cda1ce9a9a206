// ddp::checkpoint, ddp::checkpoint_wrapper and ddp::apply_activation_checkpointing on one
// process: gradients bit-identical to the un-checkpointed run (with dropout: the same
// mask; under bf16 autocast), the RNG stream left where the un-checkpointed run leaves
// it, no input requiring grad, several outputs and non-tensor arguments, nesting, tensor
// hooks, retain_graph, state dict keys, and the errors a user can cause. Under DDP and
// fully_shard: activation_checkpoint_parallel_test.cpp; against PyTorch's
// torch.utils.checkpoint: activation_checkpoint_python_test.cpp.

#include "parallel/activation_checkpoint_test_models.h"

#include <ddp/amp/autocast.h>
#include <ddp/fsdp/fully_shard.h>

#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/container/sequential.h>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace activation_checkpoint_test {

namespace {

using ddp_test::DropBlockImpl;
using ddp_test::error_of;
using ddp_test::init_params;
using ddp_test::same_bits;

/// What one forward and backward leaves behind.
struct Pass {
  at::Tensor out, x_grad, after;  // after: the next draws of the global generator
  std::vector<at::Tensor> grads;
};

Pass run_pass(torch::nn::Module& model, const std::function<at::Tensor(const at::Tensor&)>& forward,
              bool x_requires_grad = true) {
  Pass r;
  at::Tensor x = ddp_test::randn({5, ddp_test::kDropDim}, 11);
  if (x_requires_grad) x.requires_grad_(true);
  torch::manual_seed(123);
  r.out = forward(x);
  (r.out * r.out).sum().backward();
  r.after = at::rand({6});
  r.x_grad = x.grad();
  for (const auto& p : model.parameters()) r.grads.push_back(p.grad());
  return r;
}

void expect_same(const Pass& want, const Pass& got, const std::string& what) {
  EXPECT_TRUE(same_bits(want.out, got.out)) << what << ": outputs";
  EXPECT_EQ(want.x_grad.defined(), got.x_grad.defined()) << what;
  if (want.x_grad.defined() && got.x_grad.defined()) {
    EXPECT_TRUE(same_bits(want.x_grad, got.x_grad)) << what << ": input gradient";
  }
  ASSERT_EQ(want.grads.size(), got.grads.size()) << what;
  for (size_t i = 0; i < want.grads.size(); ++i) {
    ASSERT_TRUE(want.grads[i].defined() && got.grads[i].defined()) << what << ": parameter " << i;
    EXPECT_TRUE(same_bits(want.grads[i], got.grads[i]))
        << what << ": parameter " << i << " differs by "
        << ddp_test::max_diff(want.grads[i], got.grads[i]);
  }
  EXPECT_TRUE(same_bits(want.after, got.after)) << what << ": the recompute advanced the RNG";
}

std::shared_ptr<DropBlockImpl> drop_block(double p = 0.3) {
  auto m = std::make_shared<DropBlockImpl>(p);
  init_params(*m, 7);
  return m;
}

TEST(ActivationCheckpoint, FunctionGradientsEqualBitForBitWithDropout) {
  auto direct = drop_block(), model = drop_block();
  const Pass want = run_pass(*direct, [&](const at::Tensor& x) { return direct->forward(x); });
  at::Tensor out;
  const Pass got = run_pass(*model, [&](const at::Tensor& x) {
    out = ddp::checkpoint([model](const at::Tensor& h) { return model->forward(h); }, x);
    return out;
  });
  expect_same(want, got, "ddp::checkpoint");
  EXPECT_EQ(direct->calls, 1);
  EXPECT_EQ(model->calls, 2);  // the forward, and the recompute in backward
  // One node stands for the block: its edges lead to the input and the six parameters,
  // with none of the block's activations in between.
  ASSERT_TRUE(out.grad_fn());
  EXPECT_EQ(out.grad_fn()->name(), "ddp::CheckpointBackward");
  EXPECT_EQ(out.grad_fn()->next_edges().size(), 7u);
  // The dropout mask matters: without the RNG restored the recompute differs.
  auto unpreserved = drop_block();
  const Pass other = run_pass(*unpreserved, [&](const at::Tensor& x) {
    return ddp::checkpoint(
        ddp::ActivationCheckpointOptions().preserve_rng_state(false),
        [unpreserved](const at::Tensor& h) { return unpreserved->forward(h); }, x);
  });
  EXPECT_FALSE(same_bits(want.grads[2], other.grads[2]));
}

TEST(ActivationCheckpoint, WrapperGradientsEqualBitForBitWithDropout) {
  auto d1 = drop_block(), d2 = drop_block();
  torch::nn::Sequential direct(d1, d2);
  auto b1 = drop_block(), b2 = drop_block();
  torch::nn::Sequential wrapped(ddp::checkpoint_wrapper(b1), ddp::checkpoint_wrapper(b2));
  // The same keys and the same tensors as the unwrapped blocks.
  const auto want_keys = direct->named_parameters().keys();
  EXPECT_EQ(wrapped->named_parameters().keys(), want_keys);
  EXPECT_TRUE(wrapped->named_parameters()["0.fc1.weight"].is_same(b1->fc1->weight));
  EXPECT_EQ(wrapped->named_buffers().keys(), direct->named_buffers().keys());

  const Pass want = run_pass(*direct, [&](const at::Tensor& x) { return direct->forward(x); });
  const Pass got = run_pass(*wrapped, [&](const at::Tensor& x) { return wrapped->forward(x); });
  expect_same(want, got, "checkpoint_wrapper in a Sequential");
  EXPECT_EQ(b1->calls, 2);
  EXPECT_EQ(b2->calls, 2);
  // Evaluation: no gradients, no checkpoint.
  {
    at::NoGradGuard no_grad;
    wrapped->forward(ddp_test::randn({2, ddp_test::kDropDim}, 3));
  }
  EXPECT_EQ(b1->calls, 3);
}

TEST(ActivationCheckpoint, ApplyActivationCheckpointingKeepsKeys) {
  ddp_test::TinyGptImpl direct;
  auto model = std::make_shared<ddp_test::TinyGptImpl>();
  init_params(direct, 5);
  init_params(*model, 5);
  EXPECT_EQ(ddp::apply_activation_checkpointing<ddp_test::BlockImpl>(*model), 2u);
  EXPECT_EQ(model->named_parameters().keys(), direct.named_parameters().keys());
  EXPECT_NE(model->blocks->ptr<ddp::CheckpointWrapperImpl<ddp_test::BlockImpl>>(0), nullptr);
  EXPECT_EQ(model->blocks->ptr(1)->name(), "ddp::CheckpointWrapper<ddp_test::BlockImpl>");
  const at::Tensor idx = at::randint(ddp_test::kVocab, {3, ddp_test::kCtx},
                                     at::make_generator<at::CPUGeneratorImpl>(9), at::kLong);
  direct.forward(idx).pow(2).mean().backward();
  model->forward(idx).pow(2).mean().backward();
  const auto want = direct.named_parameters();
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(same_bits(want[item.key()].grad(), item.value().grad())) << item.key();
  }
  // A second call finds nothing left to wrap.
  EXPECT_EQ(ddp::apply_activation_checkpointing<ddp_test::BlockImpl>(*model), 0u);
}

TEST(ActivationCheckpoint, ParametersGetGradientsWhenNoInputRequiresGrad) {
  // What use_reentrant=False adds over use_reentrant=True.
  auto direct = drop_block(), model = drop_block();
  const Pass want = run_pass(
      *direct, [&](const at::Tensor& x) { return direct->forward(x); }, false);
  const Pass got = run_pass(
      *model,
      [&](const at::Tensor& x) {
        return ddp::checkpoint([model](const at::Tensor& h) { return model->forward(h); }, x);
      },
      false);
  expect_same(want, got, "no input requires grad");
  EXPECT_GT(got.grads[2].abs().max().item<double>(), 0.0);
}

TEST(ActivationCheckpoint, OutputsWithoutGradientAreReturnedAsTheyAre) {
  auto model = drop_block(0.0);
  for (auto& p : model->parameters()) p.set_requires_grad(false);
  const at::Tensor x = ddp_test::randn({3, ddp_test::kDropDim}, 4);
  at::Tensor y = ddp::checkpoint([model](const at::Tensor& h) { return model->forward(h); }, x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_FALSE(y.grad_fn());
  EXPECT_TRUE(same_bits(y, model->forward(x)));
  EXPECT_EQ(model->calls, 2);  // once here, once just above: nothing kept for a recompute
}

TEST(ActivationCheckpoint, SeveralOutputsAndNonTensorArguments) {
  auto direct = drop_block(0.0), model = drop_block(0.0);
  auto fn = [](const std::shared_ptr<DropBlockImpl>& m) {
    return [m](const at::Tensor& x, const std::vector<at::Tensor>& ab, double scale, int64_t tag) {
      at::Tensor h = m->forward(x * scale + ab[0]);
      return std::make_tuple(h * ab[1], m->fc1(h).sum(-1), tag + 1);
    };
  };
  const at::Tensor x0 = ddp_test::randn({4, ddp_test::kDropDim}, 1);
  const at::Tensor a0 = ddp_test::randn({4, ddp_test::kDropDim}, 2);
  const at::Tensor b0 = ddp_test::randn({4, ddp_test::kDropDim}, 3);
  std::vector<at::Tensor> grads[2];
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    at::Tensor x = x0.clone().requires_grad_(true), a = a0.clone(), b = b0.clone();
    b.requires_grad_(true);
    auto f = fn(checkpointed ? model : direct);
    auto [y, z, tag] = checkpointed
                           ? ddp::checkpoint(f, x, std::vector<at::Tensor>{a, b}, 0.5, int64_t{41})
                           : f(x, {a, b}, 0.5, 41);
    EXPECT_EQ(tag, 42);
    (y.sum() + z.pow(2).sum()).backward();
    grads[checkpointed] = {x.grad(), b.grad()};
    EXPECT_FALSE(a.grad().defined());
    for (const auto& p : (checkpointed ? model : direct)->parameters())
      grads[checkpointed].push_back(p.grad());
  }
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_TRUE(same_bits(grads[0][i], grads[1][i])) << "gradient " << i;
  }
  // Only the first output used: the gradients are the direct call's all the same.
  std::vector<at::Tensor> first[2];
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    auto& m = checkpointed ? model : direct;
    m->zero_grad();
    at::Tensor x = x0.clone().requires_grad_(true);
    auto f = fn(m);
    auto [y, z, tag] = checkpointed
                           ? ddp::checkpoint(f, x, std::vector<at::Tensor>{a0, b0}, 1.0, int64_t{0})
                           : f(x, {a0, b0}, 1.0, 0);
    y.sum().backward();
    first[checkpointed] = {x.grad(), m->fc2->weight.grad(), m->ln->weight.grad()};
  }
  for (size_t i = 0; i < first[0].size(); ++i) {
    EXPECT_TRUE(same_bits(first[0][i], first[1][i])) << "first output only, gradient " << i;
  }
}

TEST(ActivationCheckpoint, NestedCheckpoints) {
  auto direct = drop_block(), model = drop_block();
  const Pass want =
      run_pass(*direct, [&](const at::Tensor& x) { return direct->forward(direct->forward(x)); });
  const Pass got = run_pass(*model, [&](const at::Tensor& x) {
    return ddp::checkpoint(
        [model](const at::Tensor& h) {
          at::Tensor inner =
              ddp::checkpoint([model](const at::Tensor& g) { return model->forward(g); }, h);
          return model->forward(inner);
        },
        x);
  });
  expect_same(want, got, "nested");
}

TEST(ActivationCheckpoint, TensorHooksRunOnce) {
  auto direct = drop_block(), model = drop_block();
  int calls[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    auto& m = i == 0 ? direct : model;
    int* count = &calls[i];
    m->fc2->weight.register_hook([count](at::Tensor g) {
      ++*count;
      return g * 2;
    });
  }
  const Pass want = run_pass(*direct, [&](const at::Tensor& x) { return direct->forward(x); });
  const Pass got = run_pass(*model, [&](const at::Tensor& x) {
    return ddp::checkpoint([model](const at::Tensor& h) { return model->forward(h); }, x);
  });
  expect_same(want, got, "with a tensor hook");
  EXPECT_EQ(calls[0], 1);
  EXPECT_EQ(calls[1], 1);
}

TEST(ActivationCheckpoint, RetainGraphRunsBackwardTwice) {
  auto direct = drop_block(), model = drop_block();
  auto twice = [](torch::nn::Module& m, const std::function<at::Tensor(const at::Tensor&)>& f) {
    at::Tensor x = ddp_test::randn({5, ddp_test::kDropDim}, 11).requires_grad_(true);
    torch::manual_seed(1);
    at::Tensor loss = f(x).pow(2).sum();
    loss.backward({}, /*retain_graph=*/true);
    loss.backward();
    std::vector<at::Tensor> g{x.grad()};
    for (const auto& p : m.parameters()) g.push_back(p.grad());
    return g;
  };
  const auto want = twice(*direct, [&](const at::Tensor& x) { return direct->forward(x); });
  const auto got = twice(*model, [&](const at::Tensor& x) {
    return ddp::checkpoint([model](const at::Tensor& h) { return model->forward(h); }, x);
  });
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(same_bits(want[i], got[i])) << i;
  EXPECT_EQ(model->calls, 3);
}

TEST(ActivationCheckpoint, AutocastBf16EqualsUncheckpointed) {
  ddp_test::TinyGptImpl direct;
  auto model = std::make_shared<ddp_test::TinyGptImpl>();
  init_params(direct, 21);
  init_params(*model, 21);
  ddp::apply_activation_checkpointing<ddp_test::BlockImpl>(*model);
  const at::Tensor idx = at::randint(ddp_test::kVocab, {3, ddp_test::kCtx},
                                     at::make_generator<at::CPUGeneratorImpl>(8), at::kLong);
  at::Tensor out[2];
  for (int i = 0; i < 2; ++i) {
    ddp::amp::AutocastGuard autocast(at::kCPU);  // bfloat16
    out[i] = i == 0 ? direct.forward(idx) : model->forward(idx);
    EXPECT_EQ(out[i].scalar_type(), at::kBFloat16);
  }
  EXPECT_TRUE(same_bits(out[0], out[1]));
  out[0].to(at::kFloat).pow(2).mean().backward();
  out[1].to(at::kFloat).pow(2).mean().backward();
  // The recompute runs in bf16 too: in float32 the gradients would differ.
  const auto want = direct.named_parameters();
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(same_bits(want[item.key()].grad(), item.value().grad())) << item.key();
  }
  EXPECT_FALSE(ddp::amp::is_autocast_enabled(at::kCPU));
}

// ---- errors --------------------------------------------------------------------------

TEST(ActivationCheckpoint, ErrorsOfUse) {
  auto model = drop_block(0.0);
  auto block = [model](const at::Tensor& h) { return model->forward(h); };
  const at::Tensor x0 = ddp_test::randn({3, ddp_test::kDropDim}, 4);

  at::Tensor loss = ddp::checkpoint(block, x0).sum();
  loss.backward();
  std::string e = error_of([&] { loss.backward(); });
  EXPECT_ERROR_HAS(e, "ddp::checkpoint: backward ran through this checkpoint a second time");
  EXPECT_ERROR_HAS(e, "retain_graph=true");

  e = error_of(
      [&] { ddp::checkpoint([](const at::Tensor&) { return std::vector<at::Tensor>{}; }, x0); });
  EXPECT_ERROR_HAS(e, "the checkpointed function returned no tensor");

  e = error_of([&] {
    ddp::checkpoint([model](const at::Tensor& h) { return model->forward(h.mul_(2)); }, x0.clone());
  });
  EXPECT_ERROR_HAS(e, "modified its argument 0");
  EXPECT_ERROR_HAS(e, "x.clone()");

  at::Tensor x = x0.clone().requires_grad_(true) * 1;
  loss = ddp::checkpoint(block, x).sum();
  {
    at::NoGradGuard no_grad;
    x.add_(1);
  }
  e = error_of([&] { loss.backward(); });
  EXPECT_ERROR_HAS(e, "argument 0 (Float[3, 8]) was modified in place between");

  loss = ddp::checkpoint(block, x0).sum();
  {
    at::NoGradGuard no_grad;
    model->fc1->weight.add_(1);  // an optimizer step before backward
  }
  e = error_of([&] { loss.backward(); });
  EXPECT_ERROR_HAS(e, "a parameter it uses (Float[32, 8]) was modified in place between");

  const at::Tensor outside = model->fc2->bias * 2;
  e = error_of(
      [&] { ddp::checkpoint([outside](const at::Tensor& h) { return h * outside; }, x0); });
  EXPECT_ERROR_HAS(e, "computed outside the checkpointed function");
  EXPECT_ERROR_HAS(e, "pass the tensor to ddp::checkpoint as an argument");

  auto other = drop_block(0.0);
  auto calls = std::make_shared<int>(0);
  loss = ddp::checkpoint(
             [model, other, calls](const at::Tensor& h) {
               return ++*calls == 1 ? model->forward(h) : other->forward(h);
             },
             x0)
             .sum();
  e = error_of([&] { loss.backward(); });
  EXPECT_ERROR_HAS(e, "the recompute in backward used");
  EXPECT_ERROR_HAS(e, "must compute the same thing");

  at::Tensor xg = x0.clone().requires_grad_(true);
  at::Tensor y = ddp::checkpoint(block, xg).sum();
  e = error_of([&] { torch::autograd::grad({y}, {xg}, {}, /*retain_graph=*/true, true); });
  EXPECT_ERROR_HAS(e, "create_graph=true (double backward) is not supported");
}

struct HeldBlockNetImpl : torch::nn::Module {
  HeldBlockNetImpl()
      : block(register_module("block", std::make_shared<DropBlockImpl>(0.0))),
        seq(register_module("seq", torch::nn::Sequential(std::make_shared<DropBlockImpl>(0.0)))) {}
  std::shared_ptr<DropBlockImpl> block;  // a typed field: cannot hold a wrapper
  torch::nn::Sequential seq;
};

TEST(ActivationCheckpoint, ApplyRefusesTypedFields) {
  HeldBlockNetImpl net;
  const auto keys = net.named_parameters().keys();
  const std::string e = error_of([&] { ddp::apply_activation_checkpointing<DropBlockImpl>(net); });
  EXPECT_ERROR_HAS(e,
                   "ddp::apply_activation_checkpointing: the ddp_test::DropBlockImpl at 'block'");
  EXPECT_ERROR_HAS(e, "ddp::CheckpointWrapper<ddp_test::DropBlockImpl>");
  EXPECT_ERROR_HAS(e, "Nothing was changed.");
  // Nothing changed: the Sequential's block is not wrapped either.
  EXPECT_NE(net.seq->ptr<DropBlockImpl>(0), nullptr);
  EXPECT_EQ(net.named_parameters().keys(), keys);
}

TEST(ActivationCheckpoint, RefusesCheckpointAroundDdpAndFullyShard) {
  ddp_test::run_thread_groups(1, [](ddp::ProcessGroup& pg) {
    auto model = drop_block(0.0);
    auto dmodel = ddp::DistributedDataParallel(model, ddp_test::options_for(pg));
    const at::Tensor x = ddp_test::randn({3, ddp_test::kDropDim}, 4);
    std::string e = error_of(
        [&] { ddp::checkpoint([dmodel](const at::Tensor& h) mutable { return dmodel(h); }, x); });
    EXPECT_ERROR_HAS(e, "ddp::DistributedDataParallel: its forward ran inside a function that "
                        "ddp::checkpoint");

    auto opts = ddp::FullyShardOptions().process_group(ddp_test::borrow(pg));
    auto net = std::make_shared<ddp_test::TinyGptImpl>();
    init_params(*net, 3);
    auto unit = ddp::fully_shard(net->blocks->ptr<ddp_test::BlockImpl>(0), opts);
    // The wrapper around a unit is refused where it is made...
    e = error_of([&] { ddp::checkpoint_wrapper(unit.ptr()); });
    EXPECT_ERROR_HAS(e, "is or contains the fully_shard unit");
    // ... and around a module whose unit is not in place yet, at its forward.
    {
      auto wrapped = ddp::checkpoint_wrapper(net->blocks->ptr<ddp_test::BlockImpl>(0));
      e = error_of([&] { wrapped(ddp_test::randn({2, ddp_test::kCtx, ddp_test::kDim}, 1)); });
      EXPECT_ERROR_HAS(e, "which is inside the wrapper");
    }
    // The function form around a unit, at its forward.
    ddp::fully_shard(net->blocks->ptr<ddp_test::BlockImpl>(1), opts);
    auto root = ddp::fully_shard(net, opts);
    const at::Tensor idx = at::randint(ddp_test::kVocab, {2, ddp_test::kCtx},
                                       at::make_generator<at::CPUGeneratorImpl>(2), at::kLong);
    e = error_of(
        [&] { ddp::checkpoint([root](const at::Tensor& i) mutable { return root(i); }, idx); });
    EXPECT_ERROR_HAS(e, "ddp::FullyShard<ddp_test::TinyGptImpl>: its forward ran inside a "
                        "function that ddp::checkpoint");
    EXPECT_ERROR_HAS(e, "then ddp::fully_shard");
    // Refused before the unit's step began: the model still trains.
    root(idx).pow(2).mean().backward();
    EXPECT_TRUE(net->wte->weight.grad().defined());
  });
}

}  // namespace

}  // namespace activation_checkpoint_test
