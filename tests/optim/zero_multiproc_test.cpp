// A ZeRO run killed mid-way (kill -9 of one rank) and restarted by
// `ddprun --max-restarts 1` resumes from its last checkpoint and ends with the bits of
// the same run uninterrupted.

#include "optim/zero_test_util.h"
#include "support/util.h"

#include <ddp/serialize/checkpoint.h>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace zero_multiproc_test {

using ddp_test::contains;
using ddp_test::env_or;
using ddp_test::ProcessOptions;
using ddp_test::run_processes;
using ddp_test::self_exe;
using ddp_test::TempDir;

namespace {

constexpr int64_t kSteps = 12;
constexpr int64_t kKillStep = 7;  // after step 7; the last checkpoint is step 6

}  // namespace

// The training program. Environment: DDP_ZERO_DIR (checkpoints; resumes from the
// latest), DDP_ZERO_OUT (rank 0 writes the final state dict), DDP_ZERO_KILL_RANK (on the
// first attempt, that rank kills itself after step kKillStep).
DDP_SCENARIO(zero_train) {
  torch::set_num_threads(1);
  ddp::ProcessGroupGuard guard(ddp::InitOptions().timeout(std::chrono::seconds(60)));
  const int rank = ddp::get_rank();
  const int kill_rank = std::stoi(env_or("DDP_ZERO_KILL_RANK", "-1"));
  const bool first_attempt = env_or("TORCHELASTIC_RESTART_COUNT", "0") == "0";

  auto model = zero_test::make_wide(21, /*width=*/48);
  ddp::ZeroRedundancyOptimizer optimizer(model->parameters(),
                                         torch::optim::AdamOptions(0.01).weight_decay(1e-4));
  const ddp::CheckpointOptions where =
      ddp::CheckpointOptions(env_or("DDP_ZERO_DIR", "")).keep_last(2);
  ddp::Checkpoint ckpt(*model);
  ckpt.optimizer(&optimizer);
  int64_t step = 0;
  if (const auto path = ddp::load_latest_checkpoint(where, ckpt)) {
    step = ckpt.step();
    std::printf("rank %d resumed from %s at step %lld\n", rank, path->c_str(),
                static_cast<long long>(step));
  }
  auto dmodel = ddp::DistributedDataParallel(model);
  for (; step < kSteps;) {
    zero_test::train_step(dmodel, optimizer, rank, step);
    ++step;
    if (step % 2 == 0) ddp::save_checkpoint(where, ckpt.step(step));
    if (step == kKillStep && first_attempt && rank == kill_rank) {
      std::printf("rank %d kills itself after step %lld\n", rank, static_cast<long long>(step));
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
  }
  if (rank == 0) ddp::save_model_state_dict(*model, env_or("DDP_ZERO_OUT", ""));
  std::printf("rank %d finished at step %lld holding %lld bytes of optimizer state\n", rank,
              static_cast<long long>(step), static_cast<long long>(optimizer.local_state_bytes()));
  return 0;
}

TEST(ZeroMultiProcTest, DdprunRestartAfterKill9EndsBitIdentical) {
  const std::string ddprun = std::string(DDP_BINARY_DIR) + "/bin/ddprun";
  ASSERT_EQ(::access(ddprun.c_str(), X_OK), 0)
      << "ddprun is not built at " << ddprun
      << "; build it first (ninja ddprun in this build directory). This test does not skip.";
  TempDir tmp;
  ProcessOptions reference;
  reference.env["DDP_ZERO_DIR"] = tmp.file("full");
  reference.env["DDP_ZERO_OUT"] = tmp.file("full.pt");
  reference.timeout = std::chrono::seconds(120);
  const auto results = run_processes(2, "zero_train", reference);
  ddp_test::expect_all_ok(results);
  for (const auto& r : results) EXPECT_TRUE(contains(r.output, "finished at step 12")) << r.output;

  const std::string command =
      "DDP_TEST_SCENARIO=zero_train DDP_ZERO_DIR='" + tmp.file("run") + "' DDP_ZERO_OUT='" +
      tmp.file("restarted.pt") + "' DDP_ZERO_KILL_RANK=1 OMP_NUM_THREADS=1 timeout -s KILL 150 '" +
      ddprun + "' --standalone --nproc-per-node 2 --max-restarts 1 -- '" + self_exe() + "'";
  std::string output;
  const int rc = ddp_test::run_command(command, &output);
  ASSERT_EQ(rc, 0) << command << "\n" << output;
  EXPECT_TRUE(contains(output, "rank 1 kills itself after step 7")) << output;
  EXPECT_TRUE(contains(output, "rank 0 resumed from")) << output;
  EXPECT_TRUE(contains(output, "ckpt-6.pt at step 6")) << output;
  EXPECT_TRUE(contains(output, "rank 1 finished at step 12")) << output;

  const auto full = ddp::read_state_dict(tmp.file("full.pt"));
  const auto restarted = ddp::read_state_dict(tmp.file("restarted.pt"));
  ASSERT_EQ(full.size(), restarted.size());
  for (const auto& e : full) {
    EXPECT_TRUE(ddp_test::same_bits(e.value(), restarted.at(e.key()))) << e.key() << " differs";
  }
}

}  // namespace zero_multiproc_test
