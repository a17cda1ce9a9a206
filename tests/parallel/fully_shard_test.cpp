// ddp::fully_shard against plain DDP (same initial weights, same batches, Adam): the
// parameters after 20 steps agree within 1e-5, for a small transformer (tied output
// weights) and an MLP whose sizes are not multiples of the world size, at 2 and 3 ranks,
// with reshard_after_forward both ways, gradient accumulation, frozen parameters,
// gradient clipping, and bf16 compute (against a hand-written bf16 reference). Then the
// state dicts, and the errors a user can cause.

#include "parallel/ddp_test_util.h"
#include "parallel/fsdp_test_models.h"
#include "fsdp/shard_unit.h"

#include <ddp/fsdp/fully_shard.h>
#include <ddp/serialize/checkpoint.h>

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <ddp/amp/grad_scaler.h>

#include <limits>

#include <cmath>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace fully_shard_test {

namespace {

using ddp_test::BlockImpl;
using ddp_test::borrow;
using ddp_test::error_of;
using ddp_test::init_params;
using ddp_test::kCtx;
using ddp_test::kVocab;
using ddp_test::options_for;
using ddp_test::run_thread_groups;
using ddp_test::TinyGptImpl;

/// Sizes 7, 13, 5, 3: no multiple of 2 or 3 in sight.
std::shared_ptr<torch::nn::SequentialImpl> make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(7, 13), torch::nn::Functional(at::tanh),
                               torch::nn::Linear(13, 5), torch::nn::Functional(at::tanh),
                               torch::nn::Linear(5, 3))
      .ptr();
}

struct Config {
  int world = 2;
  bool transformer = true;
  bool reshard = true;
  int accum = 1;
  bool frozen = false;
  bool clip = false;
  int steps = 20;
};

std::shared_ptr<torch::nn::Module> make_model(const Config& c) {
  std::shared_ptr<torch::nn::Module> m;
  if (c.transformer) {
    m = std::make_shared<TinyGptImpl>();
  } else {
    m = make_mlp();
  }
  init_params(*m, 1234);
  if (c.frozen) {
    for (auto& item : m->named_parameters()) {
      // A whole frozen layer and a frozen bias.
      if (ddp_test::contains(item.key(), "ln_f") || item.key() == "blocks.0.proj.bias" ||
          item.key() == "0.bias" || item.key() == "2.weight") {
        item.value().set_requires_grad(false);
      }
    }
  }
  return m;
}

at::Tensor batch_input(const Config& c, int step, int micro, int rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step * 37 + micro * 7 + rank);
  if (c.transformer) return at::randint(kVocab, {3, kCtx}, gen, at::kLong);
  return at::randn({4, 7}, gen);
}

at::Tensor loss_of(const Config& c, const at::Tensor& out, int step, int micro, int rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5000 + step * 37 + micro * 7 + rank);
  if (c.transformer) {
    at::Tensor target = at::randint(kVocab, {3 * kCtx}, gen, at::kLong);
    return at::cross_entropy_loss(out.reshape({-1, kVocab}).to(at::kFloat), target);
  }
  return (out.to(at::kFloat) - at::randn({4, 3}, gen)).pow(2).mean();
}

/// Applies fully_shard to the blocks (or each Linear), then the root.
template <typename Root>
auto shard_model(const std::shared_ptr<Root>& model, const Config& c, ddp::ProcessGroup& pg,
                 ddp::MixedPrecisionPolicy mp = ddp::MixedPrecisionPolicy()) {
  auto opts = ddp::FullyShardOptions()
                  .process_group(borrow(pg))
                  .reshard_after_forward(c.reshard)
                  .mp_policy(mp);
  if constexpr (std::is_same<Root, TinyGptImpl>::value) {
    for (size_t i = 0; i < model->blocks->size(); ++i) {
      ddp::fully_shard(model->blocks->template ptr<BlockImpl>(i), opts);
    }
  } else {
    for (size_t i : {0, 2, 4})
      ddp::fully_shard(model->template ptr<torch::nn::LinearImpl>(i), opts);
  }
  return ddp::fully_shard(model, opts);
}

void expect_close(const c10::Dict<std::string, at::Tensor>& got, const torch::nn::Module& want,
                  double tol, const std::string& what) {
  const auto params = want.named_parameters();
  ASSERT_EQ(got.size(), params.size() + want.named_buffers().size()) << what;
  for (const auto& item : params) {
    const auto found = got.find(item.key());
    ASSERT_TRUE(found != got.end()) << what << ": key " << item.key();
    const at::Tensor g = found->value();
    ASSERT_EQ(g.sizes(), item.value().sizes()) << what << ": " << item.key();
    const double diff = ddp_test::max_diff(g, item.value());
    EXPECT_LE(diff, tol) << what << ": " << item.key();
  }
}

template <typename Root>
void train_pair(const Config& c, ddp::ProcessGroup& pg, const std::string& what) {
  const int rank = pg.rank();
  auto ref = std::dynamic_pointer_cast<Root>(make_model(c));
  auto dmodel = ddp::DistributedDataParallel(ref, options_for(pg));
  torch::optim::Adam ref_opt(ref->parameters(), torch::optim::AdamOptions(1e-2));

  auto model = std::dynamic_pointer_cast<Root>(make_model(c));
  auto fsdp = shard_model(model, c, pg);
  torch::optim::Adam opt(fsdp->parameters(), torch::optim::AdamOptions(1e-2));

  for (int step = 0; step < c.steps; ++step) {
    for (int micro = 0; micro < c.accum; ++micro) {
      const bool last = micro == c.accum - 1;
      at::Tensor x = batch_input(c, step, micro, rank);
      {
        std::unique_ptr<ddp::NoSyncGuard> guard;
        if (!last) guard = std::make_unique<ddp::NoSyncGuard>(*dmodel.get());
        loss_of(c, dmodel(x), step, micro, rank).backward();
      }
      fsdp->set_requires_gradient_sync(last);
      loss_of(c, fsdp(x), step, micro, rank).backward();
    }
    if (c.clip) {
      const double want = torch::nn::utils::clip_grad_norm_(ref->parameters(), 0.05);
      const double got = ddp::clip_grad_norm_(fsdp->parameters(), 0.05).template item<double>();
      EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, want)) << what << " step " << step;
    }
    ref_opt.step();
    opt.step();
    // Gradients zeroed in place (LibTorch 1.13's zero_grad does so; 2.x sets them to
    // none): the next backward adds to them.
    for (auto* o : {&ref_opt, &opt}) {
      for (auto& group : o->param_groups()) {
        for (auto& p : group.params()) {
          if (p.grad().defined()) p.mutable_grad().zero_();
        }
      }
    }
  }
  // At rest every sharded parameter is this rank's rows only.
  for (const auto& item : fsdp->named_parameters()) {
    const at::Tensor& p = item.value();
    auto* unit = ddp::detail::unit_of_param(p);
    ASSERT_NE(unit, nullptr) << item.key();
    const auto full = ref->named_parameters()[item.key()];
    const int64_t rows = full.dim() == 0 ? 1 : full.size(0);
    const int64_t chunk = (rows + pg.size() - 1) / pg.size();
    const int64_t mine =
        std::max<int64_t>(0, std::min(rows, (rank + 1) * chunk) - std::min(rows, rank * chunk));
    EXPECT_EQ(p.size(0), mine) << what << ": " << item.key();
  }
  const auto state = ddp::full_state_dict(*fsdp);
  if (rank == 0) {
    expect_close(state, *ref, 1e-5, what);
  } else {
    EXPECT_TRUE(state.empty()) << what;
  }
}

void run_config(const Config& c, const std::string& what) {
  run_thread_groups(
      c.world,
      [&](ddp::ProcessGroup& pg) {
        if (c.transformer) {
          train_pair<TinyGptImpl>(c, pg, what);
        } else {
          train_pair<torch::nn::SequentialImpl>(c, pg, what);
        }
      },
      std::chrono::seconds(120));
}

TEST(FullyShard, TransformerMatchesDdpAt2And3Ranks) {
  for (int world : {2, 3}) {
    Config c;
    c.world = world;
    run_config(c, "transformer, world " + std::to_string(world));
  }
}

TEST(FullyShard, MlpWithOddSizesMatchesDdpAt2And3Ranks) {
  for (int world : {2, 3}) {
    Config c;
    c.world = world;
    c.transformer = false;
    run_config(c, "mlp, world " + std::to_string(world));
  }
}

// fully_shard, DDP and clip_grad_norm_ on groups made by new_subgroups: two 2-rank jobs
// at once, whose second runs on global ranks 2 and 3.
TEST(FullyShard, OnSubgroupsMatchesDdp) {
  Config c;
  c.world = 2;
  c.clip = true;
  ddp_test::run_subgroup_copies(
      2, [&](ddp::ProcessGroup& pg) { train_pair<TinyGptImpl>(c, pg, "subgroups"); },
      std::chrono::seconds(120));
}

TEST(FullyShard, WithoutReshardAfterForwardMatchesDdp) {
  Config c;
  c.world = 3;
  c.reshard = false;
  run_config(c, "reshard_after_forward=false");
}

TEST(FullyShard, GradientAccumulationWithoutSyncMatchesDdpNoSync) {
  for (bool transformer : {true, false}) {
    Config c;
    c.world = 3;
    c.accum = 3;
    c.steps = 8;
    c.transformer = transformer;
    run_config(c, std::string("accumulation, ") + (transformer ? "transformer" : "mlp"));
  }
}

TEST(FullyShard, FrozenParametersMatchDdp) {
  for (bool transformer : {true, false}) {
    Config c;
    c.world = 2;
    c.frozen = true;
    c.transformer = transformer;
    run_config(c, std::string("frozen, ") + (transformer ? "transformer" : "mlp"));
  }
}

TEST(FullyShard, ClipGradNormIsTheGlobalNorm) {
  Config c;
  c.world = 3;
  c.clip = true;
  c.steps = 6;
  run_config(c, "clip_grad_norm_");
}

// bf16 compute, fp32 shards and fp32 reduction, against the same thing by hand: each
// rank runs a bf16 copy of the fp32 weights, its gradients are cast to fp32 and
// averaged with all_reduce, and Adam steps the fp32 weights.
TEST(FullyShard, Bf16ParamDtypeKeepsFp32ShardsAndMatchesAHandWrittenReference) {
  Config c;
  c.world = 2;
  c.steps = 10;
  run_thread_groups(c.world, [&](ddp::ProcessGroup& pg) {
    const int rank = pg.rank();
    auto master = std::dynamic_pointer_cast<TinyGptImpl>(make_model(c));
    auto compute = std::dynamic_pointer_cast<TinyGptImpl>(make_model(c));
    compute->to(at::kBFloat16);
    torch::optim::Adam ref_opt(master->parameters(), torch::optim::AdamOptions(1e-2));

    auto model = std::dynamic_pointer_cast<TinyGptImpl>(make_model(c));
    auto fsdp = shard_model(model, c, pg, ddp::MixedPrecisionPolicy().param_dtype(at::kBFloat16));
    torch::optim::Adam opt(fsdp->parameters(), torch::optim::AdamOptions(1e-2));
    for (const auto& p : fsdp->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);

    const auto mp = master->named_parameters();
    const auto cp = compute->named_parameters();
    for (int step = 0; step < c.steps; ++step) {
      at::Tensor x = batch_input(c, step, 0, rank);
      {
        at::NoGradGuard g;
        for (const auto& item : mp) cp[item.key()].copy_(item.value());
      }
      at::Tensor out = compute->forward(x);
      loss_of(c, out, step, 0, rank).backward();
      for (const auto& item : mp) {
        at::Tensor& cg = cp[item.key()].mutable_grad();
        at::Tensor g = cg.to(at::kFloat);
        pg.all_reduce(g, ddp::ReduceOp::AVG);
        item.value().mutable_grad() = g;
        cg = at::Tensor();
      }
      ref_opt.step();
      ref_opt.zero_grad();

      at::Tensor fout = fsdp(x);
      EXPECT_EQ(fout.scalar_type(), at::kBFloat16);
      loss_of(c, fout, step, 0, rank).backward();
      for (const auto& p : fsdp->parameters()) {
        ASSERT_TRUE(p.grad().defined());
        EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
      }
      opt.step();
      opt.zero_grad();
    }
    const auto state = ddp::full_state_dict(*fsdp);
    if (rank == 0) expect_close(state, *master, 1e-5, "bf16");
  });
}

// Save the full state at 3 ranks, load it at 2 (from rank 0 alone) and at 1: the model
// is the same, bit for bit; the keys are the unwrapped model's.
TEST(FullyShard, FullStateDictLoadsAtAnotherWorldSize) {
  c10::Dict<std::string, at::Tensor> saved;
  Config c;
  c.steps = 3;
  run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    auto model = std::dynamic_pointer_cast<TinyGptImpl>(make_model(c));
    auto fsdp = shard_model(model, c, pg);
    torch::optim::Adam opt(fsdp->parameters(), torch::optim::AdamOptions(1e-2));
    for (int step = 0; step < c.steps; ++step) {
      loss_of(c, fsdp(batch_input(c, step, 0, pg.rank())), step, 0, pg.rank()).backward();
      opt.step();
      opt.zero_grad();
    }
    auto state = ddp::full_state_dict(*fsdp);
    if (pg.rank() == 0) saved = state;
  });
  auto plain = std::make_shared<TinyGptImpl>();
  std::vector<std::string> keys, saved_keys;
  for (const auto& item : ddp::model_state_dict(*plain)) keys.push_back(item.key());
  for (const auto& item : saved) saved_keys.push_back(item.key());
  ASSERT_EQ(saved_keys, keys);

  for (int world : {2, 1}) {
    run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
      auto model = std::dynamic_pointer_cast<TinyGptImpl>(make_model(c));
      auto fsdp = shard_model(model, c, pg);
      const c10::Dict<std::string, at::Tensor> empty;
      ddp::load_full_state_dict(*fsdp, pg.rank() == 0 ? saved : empty, /*from_rank0=*/true);
      auto again = ddp::full_state_dict(*fsdp);
      if (pg.rank() == 0) {
        for (const auto& kv : saved) {
          EXPECT_TRUE(ddp_test::same_bits(again.at(kv.key()), kv.value())) << kv.key();
        }
      }
      // And it trains on from there.
      loss_of(c, fsdp(batch_input(c, 0, 0, pg.rank())), 0, 0, pg.rank()).backward();
    });
  }
}

// An optimizer built before fully_shard holds the same tensors (their identity is
// kept), so it steps the shards exactly as one built after.
TEST(FullyShard, OptimizerBuiltBeforeShardingStepsTheShards) {
  Config c;
  c.steps = 5;
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto a = std::dynamic_pointer_cast<TinyGptImpl>(make_model(c));
    torch::optim::Adam opt_a(a->parameters(), torch::optim::AdamOptions(1e-2));
    auto fa = shard_model(a, c, pg);
    auto b = std::dynamic_pointer_cast<TinyGptImpl>(make_model(c));
    auto fb = shard_model(b, c, pg);
    torch::optim::Adam opt_b(fb->parameters(), torch::optim::AdamOptions(1e-2));
    for (int step = 0; step < c.steps; ++step) {
      at::Tensor x = batch_input(c, step, 0, pg.rank());
      loss_of(c, fa(x), step, 0, pg.rank()).backward();
      loss_of(c, fb(x), step, 0, pg.rank()).backward();
      opt_a.step();
      opt_b.step();
      opt_a.zero_grad();
      opt_b.zero_grad();
    }
    const auto pa = fa->parameters();
    const auto pb = fb->parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(ddp_test::same_bits(pa[i], pb[i])) << i;
  });
}

TEST(FullyShard, EvalForwardFreesEveryUnitAndTrainingGoesOn) {
  Config c;
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto model = std::dynamic_pointer_cast<TinyGptImpl>(make_model(c));
    auto fsdp = shard_model(model, c, pg);
    at::Tensor x = batch_input(c, 0, 0, pg.rank());
    at::Tensor train_out = fsdp(x);
    {
      at::NoGradGuard no_grad;
      at::Tensor eval_out = fsdp(x);
      EXPECT_TRUE(ddp_test::same_bits(eval_out, train_out.detach()));
    }
    for (const auto& p : fsdp->parameters())
      EXPECT_FALSE(ddp::detail::unit_of_param(p)->unsharded());
    // The first forward's backward still finds its parameters.
    loss_of(c, train_out, 0, 0, pg.rank()).backward();
    for (const auto& p : fsdp->parameters()) EXPECT_TRUE(p.grad().defined());
  });
}

// Sharded gradients differ from rank to rank, so an overflow may sit in one rank's rows
// only. With GradScalerOptions::process_group every rank skips that step; without it
// (the control) the ranks would part ways.
TEST(FullyShard, GradScalerSkipsTheSameStepsOnEveryRank) {
  // And on groups made by new_subgroups (two 2-rank jobs at once), with the flag shared.
  for (int round = 0; round < 3; ++round) {
    const bool shared_flag = round != 1;
    auto run = round == 2 ? ddp_test::run_subgroup_copies : run_thread_groups;
    run(
        2,
        [&](ddp::ProcessGroup& pg) {
          Config c;
          c.transformer = false;
          auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(make_model(c));
          auto fsdp = shard_model(model, c, pg);
          torch::optim::Adam opt(fsdp->parameters(), torch::optim::AdamOptions(1e-2));
          ddp::amp::GradScaler scaler(
              ddp::amp::GradScalerOptions().process_group(shared_flag ? borrow(pg) : nullptr));
          at::Tensor x = batch_input(c, 0, 0, pg.rank());
          scaler.scale(loss_of(c, fsdp(x), 0, 0, pg.rank())).backward();
          // An overflow in rank 0's rows of the first layer's weight only.
          if (pg.rank() == 0) {
            at::NoGradGuard no_grad;
            model->named_parameters()["0.weight"].mutable_grad()[0][0] =
                std::numeric_limits<float>::infinity();
          }
          std::vector<at::Tensor> before;
          for (const auto& p : fsdp->parameters()) before.push_back(p.detach().clone());
          scaler.step(opt);
          scaler.update();
          bool changed = false;
          const auto after = fsdp->parameters();
          for (size_t i = 0; i < after.size(); ++i) changed |= !at::equal(after[i], before[i]);
          const bool expect_skip = shared_flag || pg.rank() == 0;
          EXPECT_EQ(changed, !expect_skip)
              << "rank " << pg.rank() << ", shared flag " << shared_flag;
          EXPECT_EQ(scaler.get_scale(), expect_skip ? 32768.0 : 65536.0) << "rank " << pg.rank();
        },
        std::chrono::seconds(30));
  }
}

// ---- errors ----------------------------------------------------------------------

TEST(FullyShard, ErrorsNameTheModule) {
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto opts = ddp::FullyShardOptions().process_group(borrow(pg));
    // Twice.
    {
      auto lin = std::make_shared<torch::nn::LinearImpl>(4, 3);
      init_params(*lin, 1);
      auto unit = ddp::fully_shard(lin, opts);
      EXPECT_ERROR_HAS(error_of([&] { ddp::fully_shard(lin, opts); }), "already sharded");
      EXPECT_ERROR_HAS(error_of([&] { ddp::fully_shard(unit, opts); }), "already sharded");
    }
    // A child after its parent.
    {
      auto net = std::make_shared<ddp_test::MlpImpl>();
      init_params(*net, 2);
      auto root = ddp::fully_shard(net, opts);
      EXPECT_ERROR_HAS(error_of([&] { ddp::fully_shard(net->fc1.ptr(), opts); }),
                       "after the module around it");
    }
    // A typed field still holds the unit's module.
    {
      auto net = std::make_shared<ddp_test::MlpImpl>();
      init_params(*net, 3);
      ddp::fully_shard(net->fc1, opts);
      const std::string e = error_of([&] { ddp::fully_shard(net, opts); });
      EXPECT_ERROR_HAS(e, "typed field");
      EXPECT_ERROR_HAS(e, "fc1");
    }
    // A sparse parameter.
    {
      auto m = std::make_shared<torch::nn::Module>();
      m->register_parameter("table", at::eye(4).to_sparse());
      EXPECT_ERROR_HAS(error_of([&] { ddp::fully_shard(m, opts); }), "'table' is sparse");
    }
    // Parameters that differ across ranks: every rank gets the error, naming it.
    {
      auto lin = std::make_shared<torch::nn::LinearImpl>(4, 3);
      init_params(*lin, 10);
      if (pg.rank() == 1) {
        at::NoGradGuard g;
        lin->bias.add_(1);
      }
      const std::string e = error_of([&] { ddp::fully_shard(lin, opts); });
      EXPECT_ERROR_HAS(e, "differ between rank 0 and rank 1");
      EXPECT_ERROR_HAS(e, "'bias'");
    }
    // DDP over sharded parameters, and fully_shard over DDP's.
    {
      auto lin = std::make_shared<torch::nn::LinearImpl>(4, 3);
      init_params(*lin, 4);
      auto unit = ddp::fully_shard(lin, opts);
      EXPECT_ERROR_HAS(error_of([&] { ddp::DistributedDataParallel(unit, options_for(pg)); }),
                       "sharded by ddp::fully_shard");
      auto other = std::make_shared<torch::nn::LinearImpl>(4, 3);
      init_params(*other, 5);
      auto dmodel = ddp::DistributedDataParallel(other, options_for(pg));
      EXPECT_ERROR_HAS(error_of([&] { ddp::fully_shard(other, opts); }),
                       "belongs to a DistributedDataParallel");
    }
    // Inside ddp::join, whose shadowing cannot stand in for a rank's rows.
    {
      Config c;
      auto model = std::dynamic_pointer_cast<TinyGptImpl>(make_model(c));
      auto fsdp = shard_model(model, c, pg);
      auto other = std::make_shared<torch::nn::LinearImpl>(4, 3);
      init_params(*other, 9);
      auto dmodel = ddp::DistributedDataParallel(other, options_for(pg));
      const std::string e =
          error_of([&] { dmodel->join([&] { fsdp(batch_input(c, 0, 0, pg.rank())); }); });
      EXPECT_ERROR_HAS(e, "cannot train inside ddp::join");
    }
    // Two forwards before a backward.
    {
      Config c;
      auto model = std::dynamic_pointer_cast<TinyGptImpl>(make_model(c));
      auto fsdp = shard_model(model, c, pg);
      at::Tensor x = batch_input(c, 0, 0, pg.rank());
      at::Tensor first = fsdp(x);
      EXPECT_ERROR_HAS(error_of([&] { fsdp(x); }), "one backward per forward");
      first = at::Tensor();  // dropped: the next forward starts afresh
      loss_of(c, fsdp(x), 0, 0, pg.rank()).backward();
    }
  });
}

}  // namespace

}  // namespace fully_shard_test
