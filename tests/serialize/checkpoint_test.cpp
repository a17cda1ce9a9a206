// Checkpoints: state dicts with Python's keys, exact resume of SGD/Adam/AdamW, RNG and
// sampler state, several ranks (threads), and a checkpoint directory. Refusals are in
// checkpoint_errors_test.cpp.

#include "serialize/checkpoint_test_util.h"
#include "support/harness.h"
#include "support/util.h"

#include <ddp/serialize/checkpoint.h>
#include <ddp/data/distributed_sampler.h>

#include <gtest/gtest.h>
#include <torch/nn.h>
#include <torch/optim.h>

#include <fstream>
#include <memory>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace checkpoint_test {

using ddp::Checkpoint;
using ddp::CheckpointOptions;
using ddp_test::error_of;
using ddp_test::expect_same_model;
using ddp_test::make_net;
using ddp_test::make_optimizer;
using ddp_test::Net;
using ddp_test::same_bits;
using ddp_test::train;

// ---- State dicts -------------------------------------------------------------------

TEST(StateDictTest, KeysAndOrderAsInPyTorch) {
  Net net;
  std::vector<std::string> keys;
  for (const auto& e : ddp::model_state_dict(*net)) keys.push_back(e.key());
  // Python's Module.state_dict(): own parameters, own buffers, then children in order.
  const std::vector<std::string> python{"conv1.weight",
                                        "conv1.bias",
                                        "bn1.weight",
                                        "bn1.bias",
                                        "bn1.running_mean",
                                        "bn1.running_var",
                                        "bn1.num_batches_tracked",
                                        "head.0.weight",
                                        "head.0.bias",
                                        "head.2.weight",
                                        "head.2.bias"};
  EXPECT_EQ(keys, python);
  // The entries are the model's tensors, not copies.
  EXPECT_EQ(ddp::model_state_dict(*net).at("conv1.weight").data_ptr(),
            net->conv1->weight.data_ptr());
}

TEST(StateDictTest, BiasFreeLayerHasNoBiasKey) {
  torch::nn::Linear fc(torch::nn::LinearOptions(3, 2).bias(false));
  const auto sd = ddp::model_state_dict(*fc);
  EXPECT_EQ(sd.size(), 1u);
  EXPECT_TRUE(sd.contains("weight"));
}

TEST(StateDictTest, SaveAndReadRoundTrip) {
  ddp_test::TempDir dir;
  Net a = make_net(1);
  auto opt = make_optimizer("sgd", a, 0.1);
  train(a, *opt, 0, 1);  // moves the BatchNorm buffers off their initial values
  ddp::save_model_state_dict(*a, dir.file("sd.pt"));
  Net b = make_net(2);
  ddp::load_model_state_dict(*b, ddp::read_state_dict(dir.file("sd.pt")));
  expect_same_model(*a, *b);
}

TEST(StateDictTest, LoadChecksEveryKeyAndShapeBeforeCopying) {
  Net net = make_net(3);
  const auto before = snapshot(*net);
  Net donor = make_net(4);
  auto sd = ddp::model_state_dict(*donor);

  c10::Dict<std::string, at::Tensor> missing = sd.copy();
  ASSERT_EQ(missing.erase("bn1.running_var"), 1u);
  std::string msg = error_of([&] { ddp::load_model_state_dict(*net, missing); });
  EXPECT_NE(msg.find("Missing key(s) that the model has: 'bn1.running_var'"), std::string::npos)
      << msg;

  c10::Dict<std::string, at::Tensor> extra = sd.copy();
  extra.insert("fc9.weight", at::zeros({1}));
  msg = error_of([&] { ddp::load_model_state_dict(*net, extra); });
  EXPECT_NE(msg.find("Unexpected key(s) that the model does not have: 'fc9.weight'"),
            std::string::npos)
      << msg;

  c10::Dict<std::string, at::Tensor> shaped = sd.copy();
  shaped.insert_or_assign("head.2.weight", at::zeros({4, 8}));
  msg = error_of([&] { ddp::load_model_state_dict(*net, shaped); });
  EXPECT_NE(msg.find("Size mismatch for 'head.2.weight': the checkpoint has shape [4, 8], the "
                     "model has [3, 8]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("nothing was loaded"), std::string::npos) << msg;
  EXPECT_TRUE(unchanged(*net, before)) << "a refused state dict changed the model";

  ddp::load_model_state_dict(*net, sd);
  expect_same_model(*net, *donor);
}

// ---- Resume --------------------------------------------------------------------------

class CheckpointResumeTest : public ::testing::TestWithParam<std::string> {};

// Train 3 steps, checkpoint, train 3 more; separately load the checkpoint into a
// differently initialised model and optimizer (other lr too) and train the same 3 steps.
// Bit-identical, so every piece of optimizer state and every hyperparameter came back.
TEST_P(CheckpointResumeTest, ContinuesBitIdentically) {
  ddp_test::TempDir dir;
  Net a = make_net(1);
  auto opt_a = make_optimizer(GetParam(), a, 0.05);
  train(a, *opt_a, 0, 3);
  ddp::CheckpointExtra extra(c10::StringType::get(), c10::AnyType::get());
  extra.insert("note", std::string("mid-run"));
  ddp::save_checkpoint(dir.file("c.pt"),
                       Checkpoint(*a).optimizer(opt_a.get()).epoch(2).step(3).extra(extra));
  train(a, *opt_a, 3, 6);

  Net b = make_net(2);
  auto opt_b = make_optimizer(GetParam(), b, 0.5);
  Checkpoint ck(*b);
  ck.optimizer(opt_b.get());
  ddp::load_checkpoint(dir.file("c.pt"), ck);
  EXPECT_EQ(ck.epoch(), 2);
  EXPECT_EQ(ck.step(), 3);
  ASSERT_TRUE(ck.extra().contains("note"));
  EXPECT_EQ(ck.extra().at("note").toStringRef(), "mid-run");
  train(b, *opt_b, 3, 6);
  expect_same_model(*a, *b);

  // Control: the model alone, with a fresh optimizer, does not continue the same way.
  Net c = make_net(2);
  auto opt_c = make_optimizer(GetParam(), c, 0.05);
  Checkpoint model_only(*c);
  ddp::load_checkpoint(dir.file("c.pt"), model_only);
  train(c, *opt_c, 3, 6);
  EXPECT_FALSE(same_bits(c->conv1->weight, a->conv1->weight))
      << "the optimizer state made no difference: the test could not fail";
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CheckpointResumeTest,
                         ::testing::Values("sgd", "adam", "amsgrad", "adamw"));

TEST(CheckpointTest, RestoresTheRngState) {
  ddp_test::TempDir dir;
  Net net;
  torch::manual_seed(5);
  ddp::save_checkpoint(dir.file("c.pt"), Checkpoint(*net));
  const at::Tensor first = torch::rand({8});
  torch::rand({100});
  Checkpoint ck(*net);
  ddp::load_checkpoint(dir.file("c.pt"), ck);
  EXPECT_TRUE(same_bits(torch::rand({8}), first));
  // rng(false) leaves the generator alone.
  const at::Tensor next = torch::rand({8});
  Checkpoint keep(*net);
  keep.rng(false);
  ddp::load_checkpoint(dir.file("c.pt"), keep);
  EXPECT_FALSE(same_bits(torch::rand({8}), first));
  (void)next;
}

TEST(CheckpointTest, RestoresTheSamplerPosition) {
  ddp_test::TempDir dir;
  Net net;
  const auto options = ddp::DistributedSamplerOptions().num_replicas(1).rank(0).seed(8);
  ddp::DistributedSampler sampler(40, options);
  sampler.set_epoch(3);
  sampler.next(5);
  sampler.next(5);
  ddp::save_checkpoint(dir.file("c.pt"), Checkpoint(*net).sampler(&sampler));
  const std::vector<size_t> rest(sampler.indices().begin() + 10, sampler.indices().end());

  ddp::DistributedSampler fresh(40, options);
  Checkpoint ck(*net);
  ck.sampler(&fresh);
  ddp::load_checkpoint(dir.file("c.pt"), ck);
  fresh.set_epoch(3);
  std::vector<size_t> got;
  while (auto b = fresh.next(7)) got.insert(got.end(), b->begin(), b->end());
  EXPECT_EQ(got, rest);
}

// ---- Several ranks (threads, each its own process group) ----------------------------

TEST(CheckpointTest, EveryRankCanReadTheFileAsSoonAsSaveReturns) {
  ddp_test::TempDir out;
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    Net net = make_net(1);
    ddp::DistributedSampler sampler(30,
                                    ddp::DistributedSamplerOptions().num_replicas(pg.size()).rank(
                                        pg.rank()));
    sampler.next(static_cast<size_t>(pg.rank() + 1));  // a different position per rank
    ddp::save_checkpoint(
        out.file("c.pt"),
        Checkpoint(*net).sampler(&sampler).process_group(ddp_test::borrow(pg)).step(7));
    // No barrier here: save_checkpoint returned, so the file is complete.
    ddp::DistributedSampler fresh(30, ddp::DistributedSamplerOptions().num_replicas(pg.size()).rank(
                                          pg.rank()));
    Net other = make_net(2);
    Checkpoint ck(*other);
    ck.sampler(&fresh).process_group(ddp_test::borrow(pg));
    ddp::load_checkpoint(out.file("c.pt"), ck);
    EXPECT_EQ(ck.step(), 7);
    EXPECT_EQ(fresh.position(), static_cast<size_t>(pg.rank() + 1)) << "rank " << pg.rank();
  });
}

TEST(CheckpointTest, RankZeroFailureFailsEveryRank) {
  ddp_test::TempDir out;
  std::vector<std::string> errors(2);
  ddp_test::run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    Net net = make_net(1);
    errors[pg.rank()] = error_of([&] {
      ddp::save_checkpoint(out.file("missing/dir/c.pt"),
                           Checkpoint(*net).process_group(ddp_test::borrow(pg)));
    });
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("failed on rank 0 (the rank that writes), so no checkpoint was "
                             "written; seen on rank " +
                             std::to_string(r)),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("missing/dir"), std::string::npos) << errors[r];
  }
}

// ---- A checkpoint directory -------------------------------------------------------------

TEST(CheckpointDirTest, KeepsTheLastNAndPointsAtTheLatest) {
  ddp_test::TempDir dir;
  const CheckpointOptions where = CheckpointOptions(dir.file("run/ckpt")).keep_last(2);
  Net net = make_net(1);
  EXPECT_FALSE(ddp::latest_checkpoint(where).has_value());
  Checkpoint none(*net);
  EXPECT_FALSE(ddp::load_latest_checkpoint(where, none).has_value());
  for (int64_t step : {10, 20, 30, 40}) {
    EXPECT_EQ(ddp::save_checkpoint(where, Checkpoint(*net).step(step)),
              dir.file("run/ckpt/ckpt-" + std::to_string(step) + ".pt"));
  }
  std::vector<std::string> files;
  std::string listing;
  ddp_test::run_command("ls -A '" + dir.file("run/ckpt") + "'", &listing);
  EXPECT_EQ(listing, "ckpt-30.pt\nckpt-40.pt\nlatest\n") << "old checkpoints or temporaries left";
  EXPECT_EQ(ddp::latest_checkpoint(where), dir.file("run/ckpt/ckpt-40.pt"));

  Net other = make_net(2);
  Checkpoint ck(*other);
  EXPECT_EQ(ddp::load_latest_checkpoint(where, ck), dir.file("run/ckpt/ckpt-40.pt"));
  EXPECT_EQ(ck.step(), 40);

  // Without the pointer (or with a dangling one) the highest step wins.
  ddp_test::run_command("rm '" + dir.file("run/ckpt/latest") + "'");
  EXPECT_EQ(ddp::latest_checkpoint(where), dir.file("run/ckpt/ckpt-40.pt"));
  std::ofstream(dir.file("run/ckpt/latest")) << "ckpt-50.pt\n";
  EXPECT_EQ(ddp::latest_checkpoint(where), dir.file("run/ckpt/ckpt-40.pt"));
}

TEST(CheckpointDirTest, KeepLastZeroKeepsAll) {
  ddp_test::TempDir dir;
  const CheckpointOptions where = CheckpointOptions(dir.path()).keep_last(0).prefix("model");
  Net net;
  for (int64_t step = 0; step < 5; ++step) ddp::save_checkpoint(where, Checkpoint(*net).step(step));
  std::string listing;
  ddp_test::run_command("ls '" + dir.path() + "' | grep -c '^model-[0-9]*.pt$'", &listing);
  EXPECT_EQ(listing, "5\n");
}

TEST(CheckpointDirTest, StaleTemporaryFromACrashIsIgnoredThenRemoved) {
  ddp_test::TempDir dir;
  const CheckpointOptions where(dir.path());
  Net net;
  ddp::save_checkpoint(where, Checkpoint(*net).step(1));
  // What a writer killed before its rename leaves behind.
  std::ofstream(dir.file(".ckpt-2.pt.tmp.4242.0")) << "half a checkpoint";
  EXPECT_EQ(ddp::latest_checkpoint(where), dir.file("ckpt-1.pt"));
  ddp::save_checkpoint(where, Checkpoint(*net).step(3));
  std::string listing;
  ddp_test::run_command("ls -A '" + dir.path() + "'", &listing);
  EXPECT_EQ(listing, "ckpt-1.pt\nckpt-3.pt\nlatest\n");
}

TEST(CheckpointDirTest, OptionsAreValidated) {
  Net net;
  EXPECT_NE(error_of([&] {
              ddp::save_checkpoint(CheckpointOptions("/tmp/x").keep_last(-1), Checkpoint(*net));
            }).find("keep_last must be >= 0 (0 keeps all), but got -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ddp::save_checkpoint(CheckpointOptions("/tmp/x").prefix("a/b"), Checkpoint(*net));
            }).find("prefix must be a non-empty file name without '/', but got 'a/b'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ddp::save_checkpoint(CheckpointOptions("/tmp/x"), Checkpoint(*net).step(-3));
            }).find("step must be >= 0 (it names the file), but got -3"),
            std::string::npos);
}

}  // namespace checkpoint_test
