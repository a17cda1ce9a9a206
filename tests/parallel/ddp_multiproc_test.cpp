// DistributedDataParallel in real processes over the default process group, started
// from the environment as torchrun would: the path a user program takes.

#include "parallel/ddp_test_util.h"
#include "support/util.h"

#include <torch/optim/sgd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace ddp_multiproc_test {

using ddp_test::fail;

namespace {

constexpr int64_t kPerRank = 5;

}  // namespace

// One step checked against the full-batch gradient, then more steps, then parameters
// compared bit for bit across processes; a trace per rank.
DDP_SCENARIO(ddp_train) {
  ddp::ProcessGroupGuard guard(
      ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(60)));
  const int r = ddp::get_rank(), world = ddp::get_world_size();
  auto x = ddp_test::randn({world * kPerRank, 8}, 7);
  auto y = ddp_test::randn({world * kPerRank, 4}, 8);

  auto want = ddp_test::full_batch_grads(ddp_test::Mlp(), 3, x, y);

  ddp_test::Mlp model;
  ddp_test::init_params(*model, 3 + r);  // rank 0's weights must win
  const char* trace = std::getenv("DDP_TEST_TRACE");
  auto dmodel = ddp::DistributedDataParallel(
      model,
      ddp::DistributedDataParallelOptions().bucket_cap_mb(0.0005).trace_path(trace ? trace : ""));
  torch::optim::SGD opt(model->parameters(), 0.05);
  ddp_test::mse(dmodel(ddp_test::shard(x, r, kPerRank)), ddp_test::shard(y, r, kPerRank))
      .backward();
  auto got = ddp_test::current_grads(*model);
  for (size_t i = 0; i < got.size(); ++i) {
    if (ddp_test::rel_error(got[i], want[i]) > 1e-5) return fail("gradient differs");
  }
  for (int step = 0; step < 4; ++step) {
    {
      ddp::trace::Scope s(dmodel, "optimizer.step");
      opt.step();
    }
    opt.zero_grad();
    ddp_test::mse(dmodel(ddp_test::randn({kPerRank, 8}, 100 * step + r)),
                  ddp_test::randn({kPerRank, 4}, 100 * step + r + 50))
        .backward();
  }
  opt.step();
  for (auto& p : model->parameters()) {
    auto all = ddp::all_gather(p.detach());
    for (int q = 1; q < world; ++q) {
      if (!at::equal(all[q], all[0])) return fail("parameters differ across ranks");
    }
  }
  if (dmodel->last_iteration_stats().iteration != 5) return fail("expected 5 iterations");
  std::printf("rank %d ok\n", r);
  return 0;
}

class DdpMultiProcTest : public ::testing::TestWithParam<int> {};

TEST_P(DdpMultiProcTest, TrainsLikeOneProcessOnTheFullBatch) {
  ddp_test::TempDir dir;
  ddp_test::ProcessOptions o;
  o.env["DDP_TEST_TRACE"] = dir.file("trace.json");
  ddp_test::expect_all_ok(ddp_test::run_processes(GetParam(), "ddp_train", o));
  for (int r = 0; r < GetParam(); ++r) {
    std::string out;
    EXPECT_EQ(ddp_test::run_command("test -s " +
                                        dir.file("trace.rank" + std::to_string(r) + ".json"),
                                    &out),
              0)
        << r;
  }
}

// Ranks that miss different parameters in one iteration (even ranks use only head_a, odd
// ranks only head_b, one parameter per bucket), as processes: no rank blocks in backward,
// every rank reports the parameters it missed at its next forward, and releasing the
// group afterwards does not wait either. The group's timeout is long, so a rank that
// waited for a collective its peers never launch would show as a slow or killed run.
DDP_SCENARIO(ddp_missing_different_parameters) {
  ddp::ProcessGroupGuard guard(
      ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(120)));
  const int r = ddp::get_rank();
  ddp_test::TwoHeads model;
  auto dmodel =
      ddp::DistributedDataParallel(model,
                                   ddp::DistributedDataParallelOptions().bucket_cap_mb(1e-6));
  const at::Tensor x = ddp_test::randn({kPerRank, 8}, r);
  dmodel(x).sum().backward();  // every parameter; then one bucket per parameter

  model->heads = r % 2 == 0 ? "a" : "b";
  const auto start = std::chrono::steady_clock::now();
  dmodel(x).sum().backward();
  const std::string msg = ddp_test::error_of([&] { dmodel(x); });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("rank %d: backward and the next forward took %.2f s: %s\n", r, seconds, msg.c_str());
  if (seconds > 20) return fail("blocked in backward");
  const std::string missing =
      r % 2 == 0 ? "'head_b.weight', 'head_b.bias'" : "'head_a.weight', 'head_a.bias'";
  if (msg.find("2 of 6 parameters got no gradient in that backward: " + missing) ==
      std::string::npos) {
    return fail("the next forward did not name the missing parameters");
  }
  return 0;  // the guard releases the group
}

TEST_P(DdpMultiProcTest, RanksMissingDifferentParametersFailFast) {
  ddp_test::ProcessOptions o;
  o.timeout = std::chrono::seconds(60);
  ddp_test::expect_all_ok(
      ddp_test::run_processes(GetParam(), "ddp_missing_different_parameters", o));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DdpMultiProcTest, ::testing::Values(2, 3));

}  // namespace ddp_multiproc_test
