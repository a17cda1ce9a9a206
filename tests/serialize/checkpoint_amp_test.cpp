// Checkpoints with a GradScaler: its state (Python's state_dict keys) is saved, a resume
// continues bit-identically, old checkpoints without it still load, a bad one is refused
// before anything changes, and Python's torch.amp.GradScaler reads it.

#include "serialize/checkpoint_test_util.h"
#include "support/harness.h"

#include "formats/pickle_io.h"

#include <ddp/amp/grad_scaler.h>
#include <ddp/serialize/checkpoint.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/nn.h>
#include <torch/optim.h>

#include <fstream>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace checkpoint_amp_test {

using ddp::Checkpoint;
using ddp::amp::GradScaler;
using ddp::amp::GradScalerOptions;
using ddp_test::error_of;
using ddp_test::make_net;
using ddp_test::Net;
using nlohmann::json;

namespace {

GradScalerOptions scaler_options() {
  return GradScalerOptions().init_scale(1 << 20).growth_interval(3);
}

// Steps [from, to) with the scaler. At steps 2 and 6 the loss is multiplied by 1e36, so
// the scaled gradients overflow float32 and the step is skipped (the inputs stay finite,
// so BatchNorm's running statistics do too).
void train_amp(Net& net, torch::optim::Optimizer& opt, GradScaler& scaler, int64_t from,
               int64_t to) {
  for (int64_t s = from; s < to; ++s) {
    const auto b = ddp_test::batch_for(s);
    opt.zero_grad();
    at::Tensor loss = torch::mse_loss(net->forward(b.first), b.second);
    if (s == 2 || s == 6) loss = loss * 1e36;
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  }
}

c10::impl::GenericDict scaler_entry(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const auto top = ddp::detail::as_dict(ddp::detail::unpickle(bytes, "test"), "file", "test");
  return ddp::detail::as_dict(top.at("scaler"), "'scaler'", "test");
}

}  // namespace

// Eight steps straight, against three steps, a checkpoint, and five more steps in fresh
// objects loaded from it: the same parameters, optimizer state and scaler state. The
// control loads without the scaler and ends with another scale and growth tracker.
TEST(CheckpointAmpTest, ResumeWithTheScalerContinuesBitIdentically) {
  ddp_test::TempDir dir;
  Net straight = make_net(1);
  auto straight_opt = ddp_test::make_optimizer("sgd", straight, 0.05);
  GradScaler straight_scaler(scaler_options());
  train_amp(straight, *straight_opt, straight_scaler, 0, 8);

  Net first = make_net(1);
  auto first_opt = ddp_test::make_optimizer("sgd", first, 0.05);
  GradScaler first_scaler(scaler_options());
  train_amp(first, *first_opt, first_scaler, 0, 3);
  ddp::save_checkpoint(
      dir.file("c.pt"),
      Checkpoint(*first).optimizer(first_opt.get()).grad_scaler(&first_scaler).step(3));

  for (const bool with_scaler : {true, false}) {
    Net resumed = make_net(9);
    auto resumed_opt = ddp_test::make_optimizer("sgd", resumed, 0.05);
    GradScaler resumed_scaler(scaler_options());
    Checkpoint ck(*resumed);
    ck.optimizer(resumed_opt.get()).grad_scaler(with_scaler ? &resumed_scaler : nullptr);
    ddp::load_checkpoint(dir.file("c.pt"), ck);
    train_amp(resumed, *resumed_opt, resumed_scaler, 3, 8);
    const bool same_scaler = resumed_scaler.get_scale() == straight_scaler.get_scale() &&
                             resumed_scaler.state_dict().at("_growth_tracker") ==
                                 straight_scaler.state_dict().at("_growth_tracker");
    if (with_scaler) {
      ddp_test::expect_same_model(*resumed, *straight);
      EXPECT_TRUE(same_scaler) << "scale " << resumed_scaler.get_scale() << " vs "
                               << straight_scaler.get_scale();
    } else {
      EXPECT_FALSE(same_scaler) << "the control should end with another scaler state";
    }
  }
  // 2^20; skip at 2 (2^19); steps 3, 4, 5 good: 2^20; skip at 6: 2^19; 7 good.
  EXPECT_EQ(straight_scaler.get_scale(), 524288.0);
}

// A checkpoint from before mixed precision (no "scaler") and one saved by a disabled
// scaler ("scaler": {}) load into an enabled scaler and leave it as it was.
TEST(CheckpointAmpTest, CheckpointsWithoutScalerStateLoadAndKeepTheScaler) {
  ddp_test::TempDir dir;
  Net net = make_net(1);
  GradScaler disabled(GradScalerOptions().enabled(false));
  ddp::save_checkpoint(dir.file("old.pt"), Checkpoint(*net));
  ddp::save_checkpoint(dir.file("disabled.pt"), Checkpoint(*net).grad_scaler(&disabled));
  EXPECT_EQ(scaler_entry(dir.file("disabled.pt")).size(), 0u);

  for (const char* name : {"old.pt", "disabled.pt"}) {
    GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(7));
    Net target = make_net(2);
    Checkpoint ck(*target);
    ck.grad_scaler(&scaler);
    ddp::load_checkpoint(dir.file(name), ck);
    EXPECT_EQ(scaler.get_scale(), 1024.0) << name;
    EXPECT_EQ(scaler.get_growth_interval(), 7) << name;
    ddp_test::expect_same_model(*target, *net);
  }
}

// A scaler entry with a value of the wrong type is refused before the model, optimizer
// or scaler change.
TEST(CheckpointAmpTest, BadScalerStateIsRefusedBeforeAnythingChanges) {
  ddp_test::TempDir dir;
  Net net = make_net(1);
  GradScaler scaler(scaler_options());
  ddp::save_checkpoint(dir.file("good.pt"), Checkpoint(*net).grad_scaler(&scaler));
  std::ifstream in(dir.file("good.pt"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  auto top = ddp::detail::as_dict(ddp::detail::unpickle(bytes, "test"), "file", "test");
  auto entry = ddp::detail::as_dict(top.at("scaler"), "'scaler'", "test");
  entry.insert_or_assign("growth_interval", 2.5);
  const std::vector<char> bad = ddp::detail::pickle(top);
  std::ofstream(dir.file("bad.pt"), std::ios::binary).write(bad.data(), bad.size());

  Net target = make_net(2);
  const std::vector<at::Tensor> before = ddp_test::snapshot(*target);
  GradScaler target_scaler(GradScalerOptions().init_scale(64));
  Checkpoint ck(*target);
  ck.grad_scaler(&target_scaler);
  const std::string msg = error_of([&] { ddp::load_checkpoint(dir.file("bad.pt"), ck); });
  EXPECT_NE(msg.find("bad.pt'): GradScaler state 'growth_interval' should be an int, but it "
                     "is a Double"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(ddp_test::unchanged(*target, before));
  EXPECT_EQ(target_scaler.get_scale(), 64.0);
}

// Python reads the entry as a plain dict with Python's keys and types, and (torch 2.3+)
// torch.amp.GradScaler("cpu").load_state_dict takes it: the same scale and tracker.
TEST(CheckpointAmpPythonTest, PythonGradScalerLoadsTheScalerState) {
  ddp_test::TempDir dir;
  Net net = make_net(1);
  auto opt = ddp_test::make_optimizer("sgd", net, 0.05);
  GradScaler scaler(scaler_options().growth_factor(1.5).backoff_factor(0.25));
  train_amp(net, *opt, scaler, 0, 4);  // one skip (step 2), one good step since
  ddp::save_checkpoint(dir.file("c.pt"), Checkpoint(*net).grad_scaler(&scaler));

  std::string output;
  const int rc =
      ddp_test::run_command(std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                                "/tests/serialize/python/checkpoint_reference.py scaler " +
                                dir.file("c.pt") + " " + dir.file("report.json"),
                            &output);
  ASSERT_EQ(rc, 0) << output;
  std::ifstream in(dir.file("report.json"));
  const json report = json::parse(in);
  EXPECT_EQ(report["type"], "dict");
  EXPECT_EQ(report["keys"], json({"scale", "growth_factor", "backoff_factor", "growth_interval",
                                  "_growth_tracker"}));
  EXPECT_EQ(report["types"], json({{"scale", "float"},
                                   {"growth_factor", "float"},
                                   {"backoff_factor", "float"},
                                   {"growth_interval", "int"},
                                   {"_growth_tracker", "int"}}));
  EXPECT_EQ(report["values"]["scale"].get<double>(), 262144.0);
  EXPECT_EQ(report["values"]["_growth_tracker"].get<int64_t>(), 1);
  if (report["grad_scaler"].is_null()) {
    GTEST_SKIP() << "torch " << report["torch"].get<std::string>()
                 << " has no CPU GradScaler: the dict was checked, load_state_dict was not "
                    "(the pip torch build checks it)";
  }
  EXPECT_EQ(report["grad_scaler"]["get_scale"].get<double>(), scaler.get_scale());
  const json& sd = report["grad_scaler"]["state_dict"];
  EXPECT_EQ(sd["scale"].get<double>(), 262144.0);
  EXPECT_EQ(sd["growth_factor"].get<double>(), 1.5);
  EXPECT_EQ(sd["backoff_factor"].get<double>(), 0.25);
  EXPECT_EQ(sd["growth_interval"].get<int64_t>(), 3);
  EXPECT_EQ(sd["_growth_tracker"].get<int64_t>(), 1);
}

}  // namespace checkpoint_amp_test
