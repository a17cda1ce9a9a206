// DDP in debug mode (DDP_DEBUG=detail), as real processes: a rank that changes its
// weights by hand is caught by the parameter checksum and named, with the parameter,
// on every rank; a job whose ranks stay in step passes every check.

#include "parallel/ddp_test_util.h"

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace ddp_debug_test {

using ddp_test::ProcessOptions;
using ddp_test::run_processes;

namespace {

constexpr int kMismatch = 30;

int train_with_debug(bool tamper) {
  ddp::ProcessGroupGuard guard(
      ddp::InitOptions().backend("gloo").debug("detail").timeout(std::chrono::seconds(20)));
  torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::Linear(3, 2));
  auto dmodel = ddp::DistributedDataParallel(model);
  try {
    for (int step = 0; step < 4; ++step) {
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      const at::Tensor x = ddp_test::randn({5, 4}, 100 + step + 10 * ddp::get_rank());
      dmodel(x).sum().backward();
      at::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.sub_(p.grad() * 0.1);
      if (tamper && step == 1 && ddp::get_rank() == 1) {
        model->named_parameters()["1.bias"].add_(1.0);  // by hand, on one rank only
      }
    }
  } catch (const ddp::MismatchError& e) {
    std::fprintf(stderr, "MismatchError: %s\n", e.what());
    return kMismatch;
  }
  return 0;
}

DDP_SCENARIO(ddp_debug_tampered_weights) { return train_with_debug(/*tamper=*/true); }
DDP_SCENARIO(ddp_debug_in_step) { return train_with_debug(/*tamper=*/false); }

class DdpDebugMultiProcTest : public ::testing::TestWithParam<int> {};

TEST_P(DdpDebugMultiProcTest, DivergedParametersAreNamedOnEveryRank) {
  ProcessOptions o;
  o.env["DDP_DEBUG_CHECK_EVERY"] = "1";
  const auto results = run_processes(GetParam(), "ddp_debug_tampered_weights", o);
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, kMismatch) << r.output;
    EXPECT_NE(r.output.find("before iteration 3, parameter '1.bias' has diverged"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("on rank 1 but"), std::string::npos) << r.output;
  }
}

TEST_P(DdpDebugMultiProcTest, RanksInStepPassEveryCheck) {
  ProcessOptions o;
  o.env["DDP_DEBUG_CHECK_EVERY"] = "1";
  ddp_test::expect_all_ok(run_processes(GetParam(), "ddp_debug_in_step", o));
}

INSTANTIATE_TEST_SUITE_P(Worlds, DdpDebugMultiProcTest, ::testing::Values(2, 3));

}  // namespace

}  // namespace ddp_debug_test
