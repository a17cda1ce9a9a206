// ZeroRedundancyOptimizer in checkpoints: the file holds the unsharded optimizer's
// state, so a run resumes from it with or without ZeRO and with any number of ranks,
// and ends with the bits of the same run done with the plain optimizer throughout.

#include "optim/zero_test_util.h"
#include "support/util.h"

#include <ddp/serialize/checkpoint.h>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace zero_checkpoint_test {

using ddp::ZeroRedundancyOptimizer;
using ddp_test::borrow;
using ddp_test::run_thread_groups;
using ddp_test::TempDir;

namespace {

constexpr int64_t kFirst = 5;   // steps before the checkpoint
constexpr int64_t kSecond = 5;  // steps after it

struct Phase {
  std::string kind;
  bool zero = false;
  std::string load;  // resume from this checkpoint first, unless empty
  int64_t from = 0;
  int64_t to = 0;
  std::string save;  // save after the last step, unless empty
};

// Runs a phase of training on this rank; returns the model.
zero_test::Wide run_phase(ddp::ProcessGroup& pg, const Phase& phase) {
  auto model = zero_test::make_wide(11);
  std::unique_ptr<torch::optim::Optimizer> plain;
  std::unique_ptr<ZeroRedundancyOptimizer> zero;
  ddp::Checkpoint ckpt(*model);
  ckpt.process_group(borrow(pg)).rng(false);
  if (phase.zero) {
    zero = zero_test::make_zero(phase.kind, model->parameters(),
                                ddp::ZeroRedundancyOptimizerOptions().process_group(borrow(pg)));
    ckpt.optimizer(zero.get());
  } else {
    plain = zero_test::make_plain(phase.kind, model->parameters());
    ckpt.optimizer(plain.get());
  }
  if (!phase.load.empty()) ddp::load_checkpoint(phase.load, ckpt);
  auto dmodel =
      ddp::DistributedDataParallel(model,
                                   ddp::DistributedDataParallelOptions().process_group(borrow(pg)));
  torch::optim::Optimizer& opt = phase.zero ? *zero : *plain;
  for (int64_t step = phase.from; step < phase.to; ++step) {
    zero_test::train_step(dmodel, opt, pg.rank(), step);
  }
  if (!phase.save.empty()) ddp::save_checkpoint(phase.save, ckpt.step(phase.to));
  return model;
}

struct Resume {
  std::string kind;
  int saved_world;
  int resumed_world;
};

}  // namespace

class ZeroCheckpointTest : public ::testing::TestWithParam<Resume> {};

// Saved by ZeRO and by the plain optimizer after the same steps with `saved_world`
// ranks; resumed with `resumed_world` ranks by each of ZeRO and plain from each of the
// two files: all four runs end with the bits of plain-from-plain.
TEST_P(ZeroCheckpointTest, ResumesAcrossShardingAndWorldSizes) {
  const Resume c = GetParam();
  TempDir dir;
  const std::string zero_file = dir.file("zero.pt");
  const std::string plain_file = dir.file("plain.pt");
  run_thread_groups(c.saved_world, [&](ddp::ProcessGroup& pg) {
    run_phase(pg, {c.kind, true, "", 0, kFirst, zero_file});
    run_phase(pg, {c.kind, false, "", 0, kFirst, plain_file});
  });
  run_thread_groups(c.resumed_world, [&](ddp::ProcessGroup& pg) {
    const int64_t end = kFirst + kSecond;
    auto reference = run_phase(pg, {c.kind, false, plain_file, kFirst, end, ""});
    const std::string at = " (rank " + std::to_string(pg.rank()) + ")";
    zero_test::expect_same_params(*run_phase(pg, {c.kind, true, zero_file, kFirst, end, ""}),
                                  *reference, "ZeRO -> ZeRO" + at);
    zero_test::expect_same_params(*run_phase(pg, {c.kind, false, zero_file, kFirst, end, ""}),
                                  *reference, "ZeRO -> plain" + at);
    zero_test::expect_same_params(*run_phase(pg, {c.kind, true, plain_file, kFirst, end, ""}),
                                  *reference, "plain -> ZeRO" + at);
  });
}

INSTANTIATE_TEST_SUITE_P(Resumes, ZeroCheckpointTest,
                         ::testing::Values(Resume{"adam", 2, 2}, Resume{"adam", 3, 2},
                                           Resume{"adamw", 2, 3}, Resume{"sgd", 3, 2},
                                           Resume{"amsgrad", 3, 1}),
                         [](const auto& info) {
                           return info.param.kind + "_" + std::to_string(info.param.saved_world) +
                                  "to" + std::to_string(info.param.resumed_world) + "ranks";
                         });

// The optimizer's part of a checkpoint, read back by a plain optimizer: every parameter
// has state, and the step count is the number of steps taken.
TEST(ZeroCheckpointContentTest, EveryParameterHasItsState) {
  TempDir dir;
  run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    run_phase(pg, {"adam", true, "", 0, 4, dir.file("z.pt")});
  });
  auto model = zero_test::make_wide(0);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(123.0));
  ddp::Checkpoint ckpt(*model);
  ddp::load_checkpoint(dir.file("z.pt"), ckpt.optimizer(&adam).rng(false));
  EXPECT_EQ(adam.state().size(), model->parameters().size());
  EXPECT_DOUBLE_EQ(adam.param_groups()[0].options().get_lr(), 0.01);
  for (const auto& entry : adam.state()) {
    EXPECT_EQ(static_cast<const torch::optim::AdamParamState&>(*entry.second).step(), 4);
  }
}

TEST(ZeroCheckpointErrorsTest, AnotherTypeIsNamedAndNothingChanges) {
  TempDir dir;
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    run_phase(pg, {"sgd", true, "", 0, 2, dir.file("sgd.pt")});
  });
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto model = zero_test::make_wide(11);
    auto zero =
        zero_test::make_zero("adam", model->parameters(),
                             ddp::ZeroRedundancyOptimizerOptions().process_group(borrow(pg)));
    ddp::Checkpoint ckpt(*model);
    ckpt.optimizer(zero.get()).process_group(borrow(pg)).rng(false);
    EXPECT_ERROR_HAS(ddp_test::error_of([&] { ddp::load_checkpoint(dir.file("sgd.pt"), ckpt); }),
                     "holds SGD optimizer state, but the optimizer is Adam");
    EXPECT_EQ(zero->local_state_bytes(), 0);
  });
}

TEST(ZeroCheckpointErrorsTest, ParameterCountsAreChecked) {
  TempDir dir;
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    run_phase(pg, {"adam", true, "", 0, 1, dir.file("a.pt")});
  });
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto model = zero_test::make_wide(11);
    std::vector<at::Tensor> params = model->parameters();
    params.pop_back();
    ZeroRedundancyOptimizer zero(params, torch::optim::AdamOptions(0.1),
                                 ddp::ZeroRedundancyOptimizerOptions().process_group(borrow(pg)));
    ddp::Checkpoint ckpt(*model);
    ckpt.optimizer(&zero).process_group(borrow(pg)).rng(false);
    EXPECT_ERROR_HAS(ddp_test::error_of([&] { ddp::load_checkpoint(dir.file("a.pt"), ckpt); }),
                     "param_groups[0] has 8 parameter(s) in the saved state, but 7 in this "
                     "ZeroRedundancyOptimizer");
  });
}

// Adagrad shards, but checkpoints hold SGD, Adam and AdamW only: the save says so on
// every rank, before any rank waits for another.
TEST(ZeroCheckpointErrorsTest, AnOptimizerCheckpointsCannotHoldIsRefused) {
  TempDir dir;
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto model = zero_test::make_wide(1);
    ZeroRedundancyOptimizer zero(model->parameters(), torch::optim::AdagradOptions(0.1),
                                 ddp::ZeroRedundancyOptimizerOptions().process_group(borrow(pg)));
    ddp::Checkpoint ckpt(*model);
    ckpt.optimizer(&zero).process_group(borrow(pg)).rng(false);
    EXPECT_ERROR_HAS(ddp_test::error_of([&] { ddp::save_checkpoint(dir.file("x.pt"), ckpt); }),
                     "checkpoints support the optimizers torch::optim::SGD, Adam and AdamW");
  });
}

// consolidate_state_dict + state_dict + load_state_dict without a checkpoint file, from
// 3 ranks to 2.
TEST(ZeroStateDictTest, ConsolidatedStateLoadsWithAnotherWorldSize) {
  c10::impl::GenericDict saved(c10::StringType::get(), c10::AnyType::get());
  std::vector<at::Tensor> after_three;
  run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    auto model = zero_test::make_wide(2);
    auto dmodel =
        ddp::DistributedDataParallel(model, ddp::DistributedDataParallelOptions().process_group(
                                                borrow(pg)));
    auto zero =
        zero_test::make_zero("adamw", model->parameters(),
                             ddp::ZeroRedundancyOptimizerOptions().process_group(borrow(pg)));
    for (int64_t s = 0; s < 3; ++s) zero_test::train_step(dmodel, *zero, pg.rank(), s);
    zero->consolidate_state_dict(/*to_rank=*/2);
    if (pg.rank() == 2) {
      saved = zero->state_dict();
      EXPECT_EQ(saved.at("type").toStringRef(), "AdamW");
      EXPECT_EQ(saved.at("state").toGenericDict().size(), model->parameters().size());
    }
  });
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto model = zero_test::make_wide(2);
    auto zero =
        zero_test::make_zero("adamw", model->parameters(),
                             ddp::ZeroRedundancyOptimizerOptions().process_group(borrow(pg)));
    zero->load_state_dict(saved);
    int64_t shard = 0;
    for (size_t i = 0; i < zero->owners().size(); ++i) shard += zero->owners()[i] == pg.rank();
    EXPECT_EQ(zero->local_optimizer().state().size(), static_cast<size_t>(shard));
  });
}

}  // namespace zero_checkpoint_test
