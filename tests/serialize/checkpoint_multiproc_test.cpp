// Nothing lost: 2 ranks trained for 2 epochs without stopping end with the same bits as
// 2 ranks killed mid-epoch and resumed from their last checkpoint, whether the job is
// restarted by hand or by `ddprun --max-restarts 1` after a kill -9 of one rank. And a
// process killed while saving leaves a complete checkpoint behind.

#include "serialize/checkpoint_test_util.h"
#include "support/harness.h"
#include "support/util.h"

#include <ddp/serialize/checkpoint.h>
#include <ddp/parallel/distributed_data_parallel.h>
#include <ddp/fsdp/fully_shard.h>
#include <ddp/distributed/process_group.h>
#include <ddp/data/distributed_sampler.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/data.h>
#include <torch/nn.h>
#include <torch/optim.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace checkpoint_multiproc_test {

using ddp_test::contains;
using ddp_test::env_or;
using ddp_test::ProcessOptions;
using ddp_test::run_processes;
using ddp_test::self_exe;
using ddp_test::TempDir;

namespace {

constexpr int64_t kSamples = 48;
constexpr int64_t kBatch = 4;
constexpr int64_t kEpochs = 2;      // 2 ranks: 24 samples, 6 steps per epoch, 12 in all
constexpr int64_t kKillStep = 9;    // epoch 1, 3 of its 6 steps done
constexpr int64_t kResumeStep = 8;  // checkpoints every 2 steps

// A small model with a buffer (BatchNorm) and randomness (Dropout): resuming exactly
// needs the buffers and every rank's RNG state, not only the parameters.
struct TinyImpl : torch::nn::Module {
  TinyImpl()
      : fc1(register_module("fc1", torch::nn::Linear(6, 16))),
        bn(register_module("bn", torch::nn::BatchNorm1d(16))),
        drop(register_module("drop", torch::nn::Dropout(0.25))),
        fc2(register_module("fc2", torch::nn::Linear(16, 1))) {}
  at::Tensor forward(at::Tensor x) { return fc2(drop(torch::relu(bn(fc1(x))))); }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Tiny);

struct XYDataset : torch::data::datasets::Dataset<XYDataset> {
  XYDataset() {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
    x = at::randn({kSamples, 6}, gen);
    y = x.sum(1, /*keepdim=*/true) * 0.5 + at::randn({kSamples, 1}, gen) * 0.1;
  }
  torch::data::Example<> get(size_t i) override {
    return {x[static_cast<int64_t>(i)], y[static_cast<int64_t>(i)]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(kSamples); }
  at::Tensor x, y;
};

// The training program. Environment:
//   DDP_CKPT_DIR        checkpoint directory (resumes from its latest checkpoint)
//   DDP_CKPT_OUT        rank 0 writes the final state dict here
//   DDP_CKPT_KILL_STEP  after this step, on the first attempt (TORCHELASTIC_RESTART_COUNT
//                       unset or 0), DDP_CKPT_KILL_RANK ("all" or a rank) kills itself
//   DDP_CKPT_NO_RNG=1   resume without restoring RNG states (a control that must differ)
//   DDP_CKPT_FSDP=1     the model under ddp::fully_shard instead of DDP (sharded before
//                       loading: each rank cuts its rows out of the checkpoint)
DDP_SCENARIO(ckpt_train) {
  torch::set_num_threads(1);
  const bool fsdp = env_or("DDP_CKPT_FSDP", "0") == "1";
  ddp::ProcessGroupGuard guard(ddp::InitOptions().timeout(std::chrono::seconds(60)));
  const int rank = ddp::get_rank();
  const int64_t kill_step = std::stoll(env_or("DDP_CKPT_KILL_STEP", "-1"));
  const std::string kill_rank = env_or("DDP_CKPT_KILL_RANK", "all");
  const bool first_attempt = env_or("TORCHELASTIC_RESTART_COUNT", "0") == "0";

  torch::manual_seed(1);
  Tiny model;
  torch::manual_seed(100 + rank);  // each rank its own dropout masks
  ddp::DistributedSampler sampler(kSamples, ddp::DistributedSamplerOptions().seed(3));
  auto loader =
      torch::data::make_data_loader(XYDataset().map(torch::data::transforms::Stack<>()), sampler,
                                    torch::data::DataLoaderOptions().batch_size(kBatch));
  ddp::FullyShard<TinyImpl> unit(nullptr);
  if (fsdp) unit = ddp::fully_shard(model.ptr());
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  const ddp::CheckpointOptions where =
      ddp::CheckpointOptions(env_or("DDP_CKPT_DIR", "")).keep_last(2);
  ddp::Checkpoint ckpt(*model);
  ckpt.optimizer(&optimizer).sampler(&sampler);
  int64_t start_epoch = 0;
  int64_t step = 0;
  ckpt.rng(env_or("DDP_CKPT_NO_RNG", "0") != "1");
  if (const auto path = ddp::load_latest_checkpoint(where, ckpt)) {
    start_epoch = ckpt.epoch();
    step = ckpt.step();
    std::printf("rank %d resumed from %s at step %lld, epoch %lld, position %zu\n", rank,
                path->c_str(), static_cast<long long>(step), static_cast<long long>(start_epoch),
                sampler.position());
  }
  ckpt.rng(true);

  // Wraps after loading: DistributedDataParallel broadcasts rank 0's parameters and
  // buffers, then averages gradients in backward and broadcasts buffers before forward.
  // (Sharded, the unit runs the model instead.)
  auto dmodel = fsdp ? nullptr : ddp::DistributedDataParallel(model);
  auto forward = [&](const at::Tensor& x) { return fsdp ? unit(x) : dmodel->forward(x); };
  int64_t steps_run = 0;
  for (int64_t epoch = start_epoch; epoch < kEpochs; ++epoch) {
    sampler.set_epoch(epoch);  // keeps a restored mid-epoch position
    for (auto& batch : *loader) {
      optimizer.zero_grad();
      torch::mse_loss(forward(batch.data), batch.target).backward();
      optimizer.step();
      ++step;
      ++steps_run;
      if (step % 2 == 0) ddp::save_checkpoint(where, ckpt.epoch(epoch).step(step));
      if (step == kill_step && first_attempt &&
          (kill_rank == "all" || kill_rank == std::to_string(rank))) {
        std::printf("rank %d kills itself after step %lld\n", rank, static_cast<long long>(step));
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
    }
  }
  const auto state = fsdp ? ddp::full_state_dict(*model) : ddp::model_state_dict(*model);
  if (rank == 0) ddp::save_state_dict(state, env_or("DDP_CKPT_OUT", ""));
  std::printf("rank %d finished: steps_run=%lld step=%lld\n", rank,
              static_cast<long long>(steps_run), static_cast<long long>(step));
  return 0;
}

// Saves checkpoints to DDP_CKPT_PATH in a loop, every parameter filled with the step, and
// after a few saves kills itself (SIGKILL from another thread) at a random moment,
// DDP_CKPT_DELAY_US microseconds at most, into a later save (seeded by DDP_CKPT_SEED, or
// at random and printed).
DDP_SCENARIO(ckpt_save_loop) {
  torch::set_num_threads(1);
  const std::string path = env_or("DDP_CKPT_PATH", "");
  torch::nn::Linear big(2048, 1024);  // 8 MiB of weights: a save takes a while
  // The kill moment is random; the seed is printed so that a failure can be replayed
  // with DDP_CKPT_SEED.
  const std::string seed_text = env_or("DDP_CKPT_SEED", "");
  const unsigned seed =
      seed_text.empty() ? std::random_device{}() : static_cast<unsigned>(std::stoul(seed_text));
  std::fprintf(stderr, "ckpt_save_loop: fault injection seed %u (replay: DDP_CKPT_SEED=%u)\n", seed,
               seed);
  std::mt19937 rng(seed);
  const int max_delay_us = std::stoi(env_or("DDP_CKPT_DELAY_US", "50000"));
  for (int64_t step = 1;; ++step) {
    {
      torch::NoGradGuard no_grad;
      for (auto& p : big->parameters()) p.fill_(static_cast<double>(step));
    }
    if (step == 4) {
      const int delay = std::uniform_int_distribution<int>(0, max_delay_us)(rng);
      std::thread([delay] {
        std::this_thread::sleep_for(std::chrono::microseconds(delay));
        ::raise(SIGKILL);
      }).detach();
    }
    ddp::save_checkpoint(path, ddp::Checkpoint(*big).rng(false).step(step));
  }
}

ProcessOptions train_env(const std::string& dir, const std::string& out, bool fsdp = false) {
  ProcessOptions o;
  if (fsdp) o.env["DDP_CKPT_FSDP"] = "1";
  o.env["DDP_CKPT_DIR"] = dir;
  o.env["DDP_CKPT_OUT"] = out;
  o.timeout = std::chrono::seconds(120);
  return o;
}

// Every tensor of two state dict files, bit for bit.
void expect_same_bits(const std::string& a, const std::string& b, bool expected = true) {
  const auto da = ddp::read_state_dict(a);
  const auto db = ddp::read_state_dict(b);
  ASSERT_EQ(da.size(), db.size());
  bool all_same = true;
  for (const auto& e : da) {
    const bool same = ddp_test::same_bits(e.value(), db.at(e.key()));
    all_same = all_same && same;
    if (expected) EXPECT_TRUE(same) << e.key() << " differs";
  }
  if (!expected) EXPECT_FALSE(all_same) << "the control run matched: the test cannot fail";
}

// The uninterrupted reference: 2 ranks, 2 epochs.
void run_reference(const TempDir& tmp, bool fsdp = false) {
  const auto results =
      run_processes(2, "ckpt_train", train_env(tmp.file("full"), tmp.file("full.pt"), fsdp));
  ddp_test::expect_all_ok(results);
  for (const auto& r : results) {
    EXPECT_TRUE(contains(r.output, "finished: steps_run=12 step=12")) << r.output;
    EXPECT_FALSE(contains(r.output, "resumed")) << r.output;
  }
}

}  // namespace

TEST(CheckpointMultiProcTest, KilledAndResumedRunEndsBitIdentical) {
  TempDir tmp;
  run_reference(tmp);

  // Every rank killed after step 9; the last checkpoint is step 8 (epoch 1, 2 batches in).
  ProcessOptions killed = train_env(tmp.file("resume"), tmp.file("resumed.pt"));
  killed.env["DDP_CKPT_KILL_STEP"] = std::to_string(kKillStep);
  killed.env["DDP_CKPT_KILL_RANK"] = "all";
  for (const auto& r : run_processes(2, "ckpt_train", killed)) {
    EXPECT_NE(r.exit_code, 0) << "rank " << r.rank << " was not killed:\n" << r.output;
  }
  const auto latest = ddp::latest_checkpoint(ddp::CheckpointOptions(tmp.file("resume")));
  ASSERT_EQ(latest, tmp.file("resume/ckpt-" + std::to_string(kResumeStep) + ".pt"));
  ASSERT_EQ(ddp_test::run_command("cp -r '" + tmp.file("resume") + "' '" + tmp.file("control") +
                                  "'"),
            0);

  const auto resumed =
      run_processes(2, "ckpt_train", train_env(tmp.file("resume"), tmp.file("resumed.pt")));
  ddp_test::expect_all_ok(resumed);
  for (const auto& r : resumed) {
    EXPECT_TRUE(contains(r.output, "ckpt-8.pt at step 8, epoch 1, position 8")) << r.output;
    EXPECT_TRUE(contains(r.output, "finished: steps_run=4 step=12")) << r.output;
  }
  expect_same_bits(tmp.file("full.pt"), tmp.file("resumed.pt"));

  // Control: the same resume without the RNG states (dropout masks) ends elsewhere.
  ProcessOptions control = train_env(tmp.file("control"), tmp.file("control.pt"));
  control.env["DDP_CKPT_NO_RNG"] = "1";
  ddp_test::expect_all_ok(run_processes(2, "ckpt_train", control));
  expect_same_bits(tmp.file("full.pt"), tmp.file("control.pt"), /*expected=*/false);
}

class CheckpointRestartMultiProcTest : public ::testing::TestWithParam<bool> {};

// GetParam(): the model under ddp::fully_shard (its checkpoints gathered from the shards,
// each rank cutting its rows out again when it resumes) instead of DDP.
TEST_P(CheckpointRestartMultiProcTest, DdprunRestartAfterKill9EndsBitIdentical) {
  const std::string ddprun = std::string(DDP_BINARY_DIR) + "/bin/ddprun";
  ASSERT_EQ(::access(ddprun.c_str(), X_OK), 0)
      << "ddprun is not built at " << ddprun
      << "; build it first (ninja ddprun in this build directory). This test does not skip.";
  TempDir tmp;
  run_reference(tmp, GetParam());

  const std::string command =
      std::string(GetParam() ? "DDP_CKPT_FSDP=1 " : "") +
      "DDP_TEST_SCENARIO=ckpt_train DDP_CKPT_DIR='" + tmp.file("run") + "' DDP_CKPT_OUT='" +
      tmp.file("restarted.pt") + "' DDP_CKPT_KILL_STEP=" + std::to_string(kKillStep) +
      " DDP_CKPT_KILL_RANK=1 OMP_NUM_THREADS=1 timeout -s KILL 150 '" + ddprun +
      "' --standalone --nproc-per-node 2 --max-restarts 1 -- '" + self_exe() + "'";
  std::string output;
  const int rc = ddp_test::run_command(command, &output);
  ASSERT_EQ(rc, 0) << command << "\n" << output;
  EXPECT_TRUE(contains(output, "rank 1 kills itself after step 9")) << output;
  EXPECT_TRUE(contains(output, "rank 0 resumed from")) << output;
  EXPECT_TRUE(contains(output, "ckpt-8.pt at step 8, epoch 1, position 8")) << output;
  EXPECT_TRUE(contains(output, "finished: steps_run=4 step=12")) << output;
  expect_same_bits(tmp.file("full.pt"), tmp.file("restarted.pt"));
}

INSTANTIATE_TEST_SUITE_P(DdpOrFullyShard, CheckpointRestartMultiProcTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("FullyShard") : std::string("Ddp");
                         });

// A crash at any moment of a save leaves the previous checkpoint or the new one, whole.
TEST(CheckpointMultiProcTest, KillDuringSaveLeavesOldOrNewCheckpoint) {
  TempDir tmp;
  const std::string path = tmp.file("c.pt");
  for (const char* delay_us : {"20000", "80000", "200000"}) {
    ProcessOptions o;
    o.launcher_env = false;
    o.env["DDP_CKPT_PATH"] = path;
    o.env["DDP_CKPT_DELAY_US"] = delay_us;
    o.timeout = std::chrono::seconds(60);
    const auto results = run_processes(1, "ckpt_save_loop", o);
    ASSERT_EQ(results[0].exit_code, 128 + SIGKILL) << results[0].output;
    SCOPED_TRACE(results[0].output);  // holds the fault injection's seed

    torch::nn::Linear big(2048, 1024);
    ddp::Checkpoint ckpt(*big);
    ckpt.rng(false);
    ddp::load_checkpoint(path, ckpt);
    EXPECT_GE(ckpt.step(), 3);
    for (const auto& p : big->parameters()) {
      EXPECT_TRUE(p.eq(static_cast<double>(ckpt.step())).all().item<bool>())
          << "a parameter holds values of another step than " << ckpt.step();
    }
  }
}

}  // namespace checkpoint_multiproc_test
