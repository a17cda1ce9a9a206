// Activation checkpointing under DistributedDataParallel and fully_shard, at 2 and 3
// ranks (threads): a model whose blocks are checkpointed trains to the same parameters as
// the same model without checkpointing, under the same wrapper and options. DDP: plain,
// find_unused_parameters (a parameter inside the checkpointed block unused on some ranks),
// static_graph, and accumulation under no_sync. fully_shard (checkpoint_wrapper applied to
// each block, then fully_shard to the wrappers and the root, as torchtitan does): plain,
// accumulation under set_requires_gradient_sync(false), bf16 param_dtype; the recompute
// runs while the unit's parameters are full.

#include "parallel/activation_checkpoint_test_models.h"

#include <ddp/fsdp/fully_shard.h>

#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/adam.h>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace activation_checkpoint_parallel_test {

namespace {

using ddp_test::borrow;
using ddp_test::init_params;
using ddp_test::kCtx;
using ddp_test::kVocab;
using ddp_test::run_thread_groups;

constexpr int kSteps = 3;

/// ddp_test::BlockImpl that records, per call, whether gradients were on and the row
/// count of its qkv weight (full: 3 * kDim; a shard has fewer).
struct RecordingBlockImpl : ddp_test::BlockImpl {
  explicit RecordingBlockImpl(std::shared_ptr<std::vector<int64_t>> log) : log(std::move(log)) {}
  at::Tensor forward(at::Tensor x) {
    log->push_back(at::GradMode::is_enabled() ? qkv->weight.size(0) : -1);
    return ddp_test::BlockImpl::forward(std::move(x));
  }
  std::shared_ptr<std::vector<int64_t>> log;
};

/// ddp_test::TinyGptImpl with recording blocks.
std::shared_ptr<ddp_test::TinyGptImpl> make_gpt(const std::shared_ptr<std::vector<int64_t>>& log) {
  auto m = std::make_shared<ddp_test::TinyGptImpl>();
  m->blocks =
      m->replace_module("blocks", torch::nn::Sequential(std::make_shared<RecordingBlockImpl>(log),
                                                        std::make_shared<RecordingBlockImpl>(log)));
  init_params(*m, 1234);
  return m;
}

/// Two Linear layers; the second only where `use_b` is set (per rank): under
/// find_unused_parameters, a parameter inside a checkpoint that some ranks do not use.
struct GatedBlockImpl : torch::nn::Module {
  GatedBlockImpl()
      : fc_a(register_module("fc_a", torch::nn::Linear(kCtx, kCtx))),
        fc_b(register_module("fc_b", torch::nn::Linear(kCtx, kCtx))) {}
  at::Tensor forward(at::Tensor x) {
    at::Tensor h = fc_a(x);
    if (use_b) h = h + fc_b(x);
    return at::tanh(h);
  }
  torch::nn::Linear fc_a, fc_b;
  bool use_b = true;
};

std::shared_ptr<torch::nn::SequentialImpl> make_gated(int rank) {
  auto b1 = std::make_shared<GatedBlockImpl>(), b2 = std::make_shared<GatedBlockImpl>();
  b2->use_b = rank != 0;
  auto m = torch::nn::Sequential(b1, b2, torch::nn::Linear(kCtx, 3)).ptr();
  init_params(*m, 99);
  return m;
}

at::Tensor tokens(int step, int micro, int rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step * 37 + micro * 7 + rank);
  return at::randint(kVocab, {3, kCtx}, gen, at::kLong);
}

at::Tensor loss_of(const at::Tensor& out, int step, int micro, int rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5000 + step * 37 + micro * 7 + rank);
  if (out.size(-1) != kVocab) return (out - at::randn(out.sizes(), gen)).pow(2).mean();
  at::Tensor target = at::randint(kVocab, {out.numel() / kVocab}, gen, at::kLong);
  return at::cross_entropy_loss(out.reshape({-1, kVocab}).to(at::kFloat), target);
}

void zero_grads(torch::optim::Optimizer& opt) {
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }
}

/// The largest difference between the two models' parameters, key by key.
double max_param_diff(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto want = a.named_parameters();
  double diff = 0;
  for (const auto& item : b.named_parameters()) {
    diff = std::max(diff, ddp_test::max_diff(want[item.key()], item.value()));
  }
  return diff;
}

// ---- DistributedDataParallel -----------------------------------------------------------

enum class DdpCase { kPlain, kFindUnused, kStaticGraph, kNoSync };

std::string name_of(DdpCase c) {
  switch (c) {
    case DdpCase::kPlain:
      return "plain";
    case DdpCase::kFindUnused:
      return "find_unused_parameters";
    case DdpCase::kStaticGraph:
      return "static_graph";
    case DdpCase::kNoSync:
      return "no_sync";
  }
  return "?";
}

/// Trains `model` under DDP for kSteps Adam steps.
template <typename M>
void train_ddp(const std::shared_ptr<M>& model, DdpCase c, ddp::ProcessGroup& pg) {
  auto opts = ddp_test::options_for(pg)
                  .find_unused_parameters(c == DdpCase::kFindUnused)
                  .static_graph(c == DdpCase::kStaticGraph);
  auto dmodel = ddp::DistributedDataParallel(model, opts);
  torch::optim::Adam opt(dmodel->parameters(), torch::optim::AdamOptions(1e-2));
  const bool gated = c == DdpCase::kFindUnused;
  const int micros = c == DdpCase::kNoSync ? 2 : 1;
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < micros; ++micro) {
      std::unique_ptr<ddp::NoSyncGuard> guard;
      if (micro + 1 < micros) guard = std::make_unique<ddp::NoSyncGuard>(*dmodel.get());
      at::Tensor x = tokens(step, micro, pg.rank());
      if (gated) x = x.to(at::kFloat) / kVocab;
      loss_of(dmodel(x), step, micro, pg.rank()).backward();
    }
    opt.step();
    zero_grads(opt);
  }
}

class CheckpointUnderDdp : public ::testing::TestWithParam<std::tuple<int, DdpCase>> {};

TEST_P(CheckpointUnderDdp, TrainsLikeWithoutCheckpointing) {
  const int world = std::get<0>(GetParam());
  const DdpCase c = std::get<1>(GetParam());
  std::vector<double> diffs(world, -1);
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    auto log = std::make_shared<std::vector<int64_t>>();
    if (c == DdpCase::kFindUnused) {
      auto ref = make_gated(pg.rank()), model = make_gated(pg.rank());
      ASSERT_EQ(ddp::apply_activation_checkpointing<GatedBlockImpl>(*model), 2u);
      train_ddp(ref, c, pg);
      train_ddp(model, c, pg);
      diffs[pg.rank()] = max_param_diff(*ref, *model);
      return;
    }
    auto ref = make_gpt(log), model = make_gpt(log);
    ASSERT_EQ(ddp::apply_activation_checkpointing<RecordingBlockImpl>(*model), 2u);
    train_ddp(ref, c, pg);
    const size_t ref_calls = log->size();
    train_ddp(model, c, pg);
    EXPECT_EQ(log->size() - ref_calls, 2 * ref_calls);  // forward and recompute
    diffs[pg.rank()] = max_param_diff(*ref, *model);
  });
  for (int r = 0; r < world; ++r) {
    // Each rank's gradients are the same bits, but the buckets fill in another order
    // (a region's gradients come together), and Gloo's ring sums an element's three
    // values in an order that depends on its place in the bucket: 3 ranks differ by a
    // rounding (about 1e-7); 2 ranks, and 3 on the shared-memory backend, not at all.
    EXPECT_LE(diffs[r], 1e-6) << name_of(c) << ", rank " << r << " of " << world;
  }
  std::printf("DDP %s, %d ranks: max |difference| %.3g\n", name_of(c).c_str(), world, diffs[0]);
}

INSTANTIATE_TEST_SUITE_P(Cases, CheckpointUnderDdp,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values(DdpCase::kPlain, DdpCase::kFindUnused,
                                                              DdpCase::kStaticGraph,
                                                              DdpCase::kNoSync)),
                         [](const auto& info) {
                           std::string n = name_of(std::get<1>(info.param));
                           return n + "_" + std::to_string(std::get<0>(info.param)) + "ranks";
                         });

// ---- fully_shard -----------------------------------------------------------------------

enum class FsdpCase { kPlain, kNoGradientSync, kBf16 };

std::string name_of(FsdpCase c) {
  switch (c) {
    case FsdpCase::kPlain:
      return "plain";
    case FsdpCase::kNoGradientSync:
      return "set_requires_gradient_sync";
    case FsdpCase::kBf16:
      return "bf16_param_dtype";
  }
  return "?";
}

/// Shards the blocks (checkpoint wrappers or blocks), then the root; trains kSteps Adam
/// steps; returns the full parameters (rank 0; empty elsewhere).
c10::Dict<std::string, at::Tensor> train_fsdp(const std::shared_ptr<ddp_test::TinyGptImpl>& model,
                                              bool checkpointed, FsdpCase c,
                                              ddp::ProcessGroup& pg) {
  ddp::MixedPrecisionPolicy mp;
  if (c == FsdpCase::kBf16) mp.param_dtype(at::kBFloat16).reduce_dtype(at::kFloat);
  auto opts = ddp::FullyShardOptions().process_group(borrow(pg)).mp_policy(mp);
  for (size_t i = 0; i < model->blocks->size(); ++i) {
    if (checkpointed) {
      ddp::fully_shard(model->blocks->ptr<ddp::CheckpointWrapperImpl<RecordingBlockImpl>>(i), opts);
    } else {
      ddp::fully_shard(model->blocks->ptr<RecordingBlockImpl>(i), opts);
    }
  }
  auto fsdp = ddp::fully_shard(model, opts);
  torch::optim::Adam opt(fsdp->parameters(), torch::optim::AdamOptions(1e-2));
  const int micros = c == FsdpCase::kNoGradientSync ? 2 : 1;
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < micros; ++micro) {
      fsdp->set_requires_gradient_sync(micro + 1 == micros);
      loss_of(fsdp(tokens(step, micro, pg.rank())), step, micro, pg.rank()).backward();
    }
    opt.step();
    zero_grads(opt);
  }
  return ddp::full_state_dict(*fsdp);
}

class CheckpointUnderFullyShard : public ::testing::TestWithParam<std::tuple<int, FsdpCase>> {};

TEST_P(CheckpointUnderFullyShard, TrainsLikeWithoutCheckpointing) {
  const int world = std::get<0>(GetParam());
  const FsdpCase c = std::get<1>(GetParam());
  c10::Dict<std::string, at::Tensor> want, got;
  std::vector<int64_t> ref_log, log;
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    auto ref_calls = std::make_shared<std::vector<int64_t>>();
    auto calls = std::make_shared<std::vector<int64_t>>();
    auto ref = make_gpt(ref_calls);
    auto model = make_gpt(calls);
    ASSERT_EQ(ddp::apply_activation_checkpointing<RecordingBlockImpl>(*model), 2u);
    auto w = train_fsdp(ref, false, c, pg);
    auto g = train_fsdp(model, true, c, pg);
    if (pg.rank() == 0) {
      want = w;
      got = g;
      ref_log = *ref_calls;
      log = *calls;
    }
  });
  ASSERT_EQ(want.size(), got.size());
  for (const auto& item : want) {
    const at::Tensor& g = got.at(item.key());
    EXPECT_TRUE(ddp_test::same_bits(item.value(), g))
        << name_of(c) << ", " << world << " ranks: " << item.key() << " differs by "
        << ddp_test::max_diff(item.value(), g);
  }
  // Each block ran twice per micro-batch (forward, recompute), both times with gradients
  // on and its full parameters: the unit gathers them again before its backward.
  EXPECT_EQ(log.size(), 2 * ref_log.size());
  for (int64_t rows : log) EXPECT_EQ(rows, 3 * ddp_test::kDim);
  for (int64_t rows : ref_log) EXPECT_EQ(rows, 3 * ddp_test::kDim);
}

INSTANTIATE_TEST_SUITE_P(Cases, CheckpointUnderFullyShard,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values(FsdpCase::kPlain,
                                                              FsdpCase::kNoGradientSync,
                                                              FsdpCase::kBf16)),
                         [](const auto& info) {
                           std::string n = name_of(std::get<1>(info.param));
                           return n + "_" + std::to_string(std::get<0>(info.param)) + "ranks";
                         });

}  // namespace

}  // namespace activation_checkpoint_parallel_test
