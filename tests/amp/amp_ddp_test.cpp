// Mixed precision with DistributedDataParallel: the found-inf decision is the same on
// every rank (Note [Found-inf across ranks] in src/amp/grad_scaler.cpp), buckets stay
// float32 under autocast, and the compression hooks compose with the scaler.

#include "amp/amp_test_util.h"
#include "parallel/ddp_test_util.h"
#include "support/util.h"

#include "amp/scaler_kernels.h"
#include "distributed/comm.h"

#include <ddp/amp/autocast.h>
#include <ddp/amp/grad_scaler.h>
#include <ddp/parallel/comm_hooks.h>

#include <torch/optim/sgd.h>

#include <mutex>
#include <set>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace amp_ddp_test {

using ddp::amp::AutocastGuard;
using ddp::amp::GradScaler;
using ddp::amp::GradScalerOptions;
using ddp_test::borrow;
using ddp_test::kInf;
using ddp_test::kNaN;
using ddp_test::options_for;
using ddp_test::PlantedGrad;
using ddp_test::run_thread_groups;
using ddp_test::same_bits;

namespace {

constexpr int64_t kRows = 4;

std::shared_ptr<ddp::CommHook> hook_named(const std::string& name) {
  if (name == "fp16") return ddp::comm_hooks::fp16_compress_hook();
  if (name == "bf16") return ddp::comm_hooks::bf16_compress_hook();
  return ddp::comm_hooks::allreduce_hook();
}

// Rank r's batch at step k: the same everywhere except what the test plants.
std::pair<at::Tensor, at::Tensor> batch(int rank, int step) {
  return {ddp_test::randn({kRows, 8}, 1000 * step + rank),
          ddp_test::randn({kRows, 4}, 1000 * step + rank + 500)};
}

// Whether every rank holds these bits.
bool same_on_every_rank(ddp::ProcessGroup& pg, const at::Tensor& t) {
  for (const at::Tensor& other : pg.all_gather(t.contiguous())) {
    if (!same_bits(other, t)) return false;
  }
  return true;
}

}  // namespace

class AmpDdpOverflowTest : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

// The last rank plants an inf (step 1), a NaN (step 3) and a finite input so large that
// its gradient overflows float32 (step 4) into its own batch, before DDP's all-reduce.
// After backward every rank holds non-finite gradients at exactly those steps (the
// all-reduce spreads them), so every rank skips them; the scale follows the closed form
// (growth_interval 2) and the parameters stay bit-identical across ranks.
TEST_P(AmpDdpOverflowTest, OverflowOnOneRankSkipsTheStepOnEveryRank) {
  const int world = std::get<0>(GetParam());
  const std::string hook = std::get<1>(GetParam());
  const std::vector<bool> want_stepped = {true, false, true, false, false, true, true, true};
  const std::vector<double> want_scale = {1024, 512, 512, 256, 128, 128, 256, 256};
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int rank = pg.rank();
    ddp_test::Mlp model;
    ddp_test::init_params(*model, 42);
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    dmodel->register_comm_hook(hook_named(hook));
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
    GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(2));
    for (int step = 0; step < static_cast<int>(want_stepped.size()); ++step) {
      auto [x, y] = batch(rank, step);
      if (rank == world - 1) {
        if (step == 1) x[0][0] = kInf;
        if (step == 3) x[1][2] = kNaN;
        if (step == 4) x[2][5] = 1e30f;
      }
      opt.zero_grad();
      scaler.scale(ddp_test::mse(dmodel(x), y)).backward();
      const bool planted = !want_stepped[step];
      EXPECT_EQ(ddp_test::any_non_finite_grad(*model), planted)
          << "rank " << rank << ", step " << step << ": the all-reduced gradients";
      const bool stepped = scaler.step(opt);
      scaler.update();
      EXPECT_EQ(stepped, want_stepped[step]) << "rank " << rank << ", step " << step;
      EXPECT_EQ(scaler.get_scale(), want_scale[step]) << "rank " << rank << ", step " << step;
      const at::Tensor params = ddp_test::flat_parameters(*model);
      EXPECT_TRUE(params.isfinite().all().item<bool>()) << "rank " << rank << ", step " << step;
      EXPECT_TRUE(same_on_every_rank(pg, params)) << "rank " << rank << ", step " << step;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsAndHooks, AmpDdpOverflowTest,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values("allreduce", "fp16", "bf16")),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

// Without DDP (each rank steps on its own gradients, as with a sharded optimizer), an inf
// on rank 1 alone makes rank 1 alone skip, and the replicas part (the control). With
// GradScalerOptions::process_group the flag is all-reduced with MAX: every rank skips,
// also a rank whose optimizer holds no gradient at all that step (rank 2 at step 2).
TEST(AmpShardedTest, FoundInfIsAllReducedWithMaxOverTheGroup) {
  for (const bool shared : {false, true}) {
    run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
      const int rank = pg.rank();
      PlantedGrad model(at::zeros({5}));
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.5));
      auto options = GradScalerOptions().growth_interval(100);
      if (shared) options.process_group(borrow(pg));
      GradScaler scaler(options);
      for (int step = 0; step < 4; ++step) {
        at::Tensor c = ddp_test::randn({5}, 10 * step + rank);
        if (rank == 1 && step == 1) c[3] = kInf;
        model->w.mutable_grad() = at::Tensor();
        const at::Tensor loss = scaler.scale(model->forward(c));
        if (!(rank == 2 && step == 2)) loss.backward();
        if (!shared && rank == 2 && step == 2) continue;  // nothing to check: Python errs
        const bool stepped = scaler.step(opt);
        scaler.update();
        const bool want = shared ? step != 1 : !(rank == 1 && step == 1);
        EXPECT_EQ(stepped, want) << "rank " << rank << ", step " << step
                                 << (shared ? " (shared)" : " (local)");
        const double want_scale = (shared || rank == 1) && step >= 1 ? 32768 : 65536;
        EXPECT_EQ(scaler.get_scale(), want_scale) << "rank " << rank << ", step " << step;
      }
    });
  }
}

// fp16 compression overflows when the scaled gradient exceeds 65504: with gradient 2 and
// scale 2^16 or 2^15 the compressed all-reduce holds inf on every rank and the step is
// skipped; at 2^14 it fits. bf16 (float32's range) never overflows here: the control.
TEST(AmpDdpTest, Fp16CompressionOverflowBacksOffTheScale) {
  for (const std::string hook : {"fp16", "bf16"}) {
    run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
      PlantedGrad model(at::zeros({6}));
      auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
      dmodel->register_comm_hook(hook_named(hook));
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.5));
      GradScaler scaler;
      std::vector<double> scales;
      std::vector<bool> stepped;
      for (int step = 0; step < 4; ++step) {
        opt.zero_grad();
        scaler.scale(dmodel(at::full({6}, 2.0f))).backward();
        stepped.push_back(scaler.step(opt));
        scaler.update();
        scales.push_back(scaler.get_scale());
      }
      if (hook == "fp16") {
        EXPECT_EQ(stepped, (std::vector<bool>{false, false, true, true}));
        EXPECT_EQ(scales, (std::vector<double>{32768, 16384, 16384, 16384}));
        EXPECT_TRUE(same_bits(model->w.detach(), at::full({6}, -2.0f)));  // two steps of -1
      } else {
        EXPECT_EQ(stepped, (std::vector<bool>{true, true, true, true}));
        EXPECT_EQ(scales, (std::vector<double>(4, 65536)));
      }
    });
  }
}

// Under autocast the forward runs in bfloat16, but the parameters are float32, so their
// gradients, DDP's buckets and the averaged result are float32: the average of the
// per-shard gradients that one process computes with the same autocast forward.
TEST(AmpDdpTest, AutocastBucketsReduceInTheParametersDtype) {
  constexpr int kWorld = 2;
  run_thread_groups(kWorld, [&](ddp::ProcessGroup& pg) {
    const int rank = pg.rank();
    // The reference: both shards in this process, under the same autocast.
    ddp_test::Mlp ref;
    ddp_test::init_params(*ref, 42);
    std::vector<at::Tensor> want;
    for (int r = 0; r < kWorld; ++r) {
      auto [x, y] = batch(r, 0);
      auto g = ddp_test::grads_after(*ref, [&, x = x, y = y] {
        AutocastGuard autocast(at::kCPU);
        return ddp_test::mse(ref->forward(x).to(at::kFloat), y);
      });
      for (size_t i = 0; i < g.size(); ++i) {
        if (r == 0)
          want.push_back(g[i] / kWorld);
        else
          want[i] += g[i] / kWorld;
      }
    }

    ddp_test::Mlp model;
    ddp_test::init_params(*model, 42);
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    std::mutex mu;
    std::set<at::ScalarType> bucket_dtypes;
    dmodel->register_comm_hook([&](ddp::GradBucket& bucket) {
      {
        std::lock_guard<std::mutex> lock(mu);
        bucket_dtypes.insert(bucket.buffer().scalar_type());
      }
      std::vector<at::Tensor> tensors{bucket.buffer()};
      return bucket.process_group().all_reduce_async(tensors, ddp::ReduceOp::AVG).future();
    });
    for (int pass = 0; pass < 2; ++pass) {  // initial buckets, then rebuilt ones
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      auto [x, y] = batch(rank, 0);
      at::Tensor out;
      {
        AutocastGuard autocast(at::kCPU);
        out = dmodel(x);
        EXPECT_EQ(out.scalar_type(), at::kBFloat16);
      }
      ddp_test::mse(out.to(at::kFloat), y).backward();
      for (const auto& p : model->parameters()) EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
      ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, 1e-6,
                                   "rank " + std::to_string(rank) + ", pass " +
                                       std::to_string(pass));
    }
    EXPECT_EQ(bucket_dtypes, (std::set<at::ScalarType>{at::kFloat}));
  });
}

// ---- AutocastGuard ---------------------------------------------------------------------

TEST(AutocastGuardTest, EnablesAndRestoresNestedState) {
  using ddp::amp::get_autocast_dtype;
  using ddp::amp::is_autocast_enabled;
  ASSERT_FALSE(is_autocast_enabled(at::kCPU));
  const at::ScalarType outside = get_autocast_dtype(at::kCPU);
  const at::Tensor x = ddp_test::randn({3, 8}, 1);
  const at::Tensor w = ddp_test::randn({4, 8}, 2);
  EXPECT_EQ(at::linear(x, w).scalar_type(), at::kFloat);
  {
    AutocastGuard outer(at::kCPU);
    EXPECT_TRUE(is_autocast_enabled(at::kCPU));
    EXPECT_EQ(get_autocast_dtype(at::kCPU), at::kBFloat16);
    EXPECT_EQ(at::linear(x, w).scalar_type(), at::kBFloat16);
    {
      AutocastGuard inner(at::kCPU, ddp::amp::AutocastOptions().enabled(false));
      EXPECT_FALSE(is_autocast_enabled(at::kCPU));
      EXPECT_EQ(at::linear(x, w).scalar_type(), at::kFloat);
    }
    EXPECT_TRUE(is_autocast_enabled(at::kCPU));
    EXPECT_EQ(at::linear(x, w).scalar_type(), at::kBFloat16);
    EXPECT_FALSE(is_autocast_enabled(at::kCUDA));
  }
  EXPECT_FALSE(is_autocast_enabled(at::kCPU));
  EXPECT_EQ(get_autocast_dtype(at::kCPU), outside);
  EXPECT_EQ(at::linear(x, w).scalar_type(), at::kFloat);
}

// Within one region autocast reuses its bfloat16 copy of a weight; leaving the outermost
// region drops the copies, so the next region sees the weight as the optimizer left it.
TEST(AutocastGuardTest, LeavingTheOutermostRegionDropsCachedWeightCopies) {
  const at::Tensor x = ddp_test::randn({2, 8}, 1);
  at::Tensor w = ddp_test::randn({4, 8}, 2).requires_grad_();
  at::Tensor first, cached, fresh;
  {
    AutocastGuard autocast(at::kCPU);
    first = at::linear(x, w).detach();
    at::NoGradGuard no_grad;
    w.mul_(2);
    cached = at::linear(x, w).detach();  // the copy made before the change
  }
  {
    AutocastGuard autocast(at::kCPU);
    fresh = at::linear(x, w).detach();
  }
  EXPECT_TRUE(same_bits(cached, first));
  EXPECT_TRUE(same_bits(fresh, first * 2));
}

TEST(AutocastGuardTest, RefusesOtherDevicesAndDtypes) {
  EXPECT_ERROR_HAS(ddp_test::error_of([] { AutocastGuard g(c10::DeviceType::XLA); }),
                   "AutocastGuard: autocast supports device types cpu and cuda, but got xla");
  EXPECT_ERROR_HAS(ddp_test::error_of([] {
                     AutocastGuard g(at::kCPU, ddp::amp::AutocastOptions().dtype(at::kFloat));
                   }),
                   "AutocastGuard: dtype must be BFloat16 or Half");
  EXPECT_FALSE(ddp::amp::is_autocast_enabled(at::kCPU));
}

// ---- On a GPU ----------------------------------------------------------------------------

// float16 autocast and the scaler on CUDA (ATen's fused kernels, in every LibTorch with
// CUDA): the forward runs in float16, the gradients stay float32, a planted inf is skipped
// and the scale follows the closed form (growth_interval 2).
TEST(AmpCudaTest, Float16AutocastAndScalerOnTheGpu) {
  if (!ddp::detail::cuda_available()) GTEST_SKIP() << "no GPU is visible";
  EXPECT_TRUE(ddp::amp::detail::has_fused_kernels(at::kCUDA));
  const at::Device gpu(at::kCUDA, 0);
  ddp_test::Mlp model;
  ddp_test::init_params(*model, 42);
  model->to(gpu);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
  GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(2));
  const std::vector<double> want_scale = {1024, 512, 512, 1024};
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = batch(0, step);
    if (step == 1) x[0][0] = kInf;
    x = x.to(gpu);
    y = y.to(gpu);
    opt.zero_grad();
    at::Tensor out;
    {
      AutocastGuard autocast(at::kCUDA);
      out = model->forward(x);
    }
    EXPECT_EQ(out.scalar_type(), at::kHalf);
    scaler.scale(ddp_test::mse(out.to(at::kFloat), y)).backward();
    for (const auto& p : model->parameters()) EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
    EXPECT_EQ(scaler.step(opt), step != 1) << "step " << step;
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), want_scale[step]) << "step " << step;
  }
  EXPECT_TRUE(ddp_test::flat_parameters(*model).isfinite().all().item<bool>());
}

}  // namespace amp_ddp_test
