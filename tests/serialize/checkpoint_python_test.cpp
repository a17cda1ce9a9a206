// Checkpoints and state dicts exchanged with PyTorch itself (DDP_TEST_PYTHON):
// tests/serialize/python/checkpoint_reference.py is the Python side.

#include "serialize/checkpoint_test_util.h"
#include "support/harness.h"
#include "support/util.h"

#include <ddp/serialize/checkpoint.h>
#include <ddp/data/distributed_sampler.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/nn.h>
#include <torch/optim.h>

#include <fstream>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace checkpoint_python_test {

using ddp::Checkpoint;
using ddp_test::max_diff;
using ddp_test::Net;
using nlohmann::json;

namespace {

std::string reference_script() {
  return std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
         "/tests/serialize/python/checkpoint_reference.py";
}

void train_step(Net& net, torch::optim::Optimizer& opt, int64_t step) {
  ddp_test::train(net, opt, step, step + 1);
}

}  // namespace

class CheckpointPythonTest : public ::testing::TestWithParam<std::string> {};

// C++ trains two steps and saves; Python's torch.load reads the checkpoint as a dict,
// loads model and optimizer state into Python's twin model and torch.optim optimizer,
// and takes the third step. C++ takes the same step; the results are the same bits.
TEST_P(CheckpointPythonTest, PythonLoadsTheCheckpointAndContinuesTraining) {
  const std::string kind = GetParam();
  ddp_test::TempDir dir;
  torch::manual_seed(1);
  Net net;
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (kind == "sgd") {
    opt = std::make_unique<torch::optim::SGD>(
        net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
  } else {
    opt = std::make_unique<torch::optim::Adam>(net->parameters(),
                                               torch::optim::AdamOptions(0.05).weight_decay(1e-4));
  }
  train_step(net, *opt, 0);
  train_step(net, *opt, 1);
  ddp::DistributedSampler sampler(10,
                                  ddp::DistributedSamplerOptions().num_replicas(1).rank(0).seed(4));
  sampler.next(3);
  ddp::CheckpointExtra extra(c10::StringType::get(), c10::AnyType::get());
  extra.insert("note", std::string("from C++"));
  extra.insert("x", ddp_test::batch_for(2).first);
  extra.insert("y", ddp_test::batch_for(2).second);
  ddp::save_checkpoint(
      dir.file("c.pt"),
      Checkpoint(*net).optimizer(opt.get()).sampler(&sampler).epoch(1).step(2).extra(extra));

  std::string output;
  const int rc =
      ddp_test::run_command(reference_script() + " continue " + dir.file("c.pt") + " " + kind +
                                " " + dir.file("py.pt") + " " + dir.file("report.json"),
                            &output);
  ASSERT_EQ(rc, 0) << output;
  std::ifstream in(dir.file("report.json"));
  const json report = json::parse(in);

  std::vector<std::string> keys;
  for (const auto& e : ddp::model_state_dict(*net)) keys.push_back(e.key());
  EXPECT_EQ(report["type"], "dict");
  EXPECT_EQ(report["model_keys"].get<std::vector<std::string>>(), keys);
  EXPECT_EQ(report["python_keys"].get<std::vector<std::string>>(), keys)
      << "Python's twin names its state differently";
  EXPECT_TRUE(report["shapes_match"].get<bool>());
  EXPECT_EQ(report["epoch"], 1);
  EXPECT_EQ(report["step"], 2);
  EXPECT_EQ(report["world_size"], 1);
  EXPECT_EQ(report["note"], "from C++");
  EXPECT_TRUE(report["rng_cpu_matches_format"].get<bool>()) << report["rng_cpu_bytes"];
  EXPECT_EQ(report["sampler"]["positions"], json::array({3}));
  EXPECT_EQ(report["sampler"]["seed"], 4);
  EXPECT_EQ(report["optimizer_type"], kind == "sgd" ? "SGD" : "Adam");
  EXPECT_EQ(report["param_names"], report["python_param_names"]);
  EXPECT_DOUBLE_EQ(report["lr"].get<double>(), 0.05) << "Python did not take the saved lr";
  EXPECT_EQ(report["state_entries"], 8);

  train_step(net, *opt, 2);
  const auto python = ddp::read_state_dict(dir.file("py.pt"));
  const auto mine = ddp::model_state_dict(*net);
  ASSERT_EQ(python.size(), mine.size());
  for (const auto& e : mine) {
    ASSERT_TRUE(python.contains(e.key())) << e.key();
    const at::Tensor p = python.at(e.key());
    if (kind == "sgd") {
      EXPECT_TRUE(ddp_test::same_bits(e.value(), p))
          << e.key() << ": Python's step differs by up to " << max_diff(e.value(), p);
    } else {
      // From 2.x on, Python's Adam (float64 bias corrections on a tensor step) and
      // LibTorch's C++ Adam round differently by about an ulp; 1.13's agreed bit for
      // bit. A lost or misread moment would move a step of lr = 0.05 by ~1e-2.
      EXPECT_LE(max_diff(e.value(), p), 1e-7)
          << e.key() << ": Python's step differs by " << max_diff(e.value(), p);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CheckpointPythonTest, ::testing::Values("sgd", "adam"));

// Python's torch.save(model.state_dict()) (an OrderedDict with _metadata, which
// LibTorch 1.13's unpickler cannot read as is) loads into the C++ twin, keys in the same
// order, and the C++ model then computes what the Python model computed.
TEST(CheckpointPythonStateDictTest, CppLoadsAPythonStateDict) {
  ddp_test::TempDir dir;
  std::string output;
  const int rc = ddp_test::run_command(reference_script() + " export " + dir.file("sd.pt") + " " +
                                           dir.file("io.pt") + " " + dir.file("one.pt"),
                                       &output);
  ASSERT_EQ(rc, 0) << output;
  const auto sd = ddp::read_state_dict(dir.file("sd.pt"));
  Net net;
  std::vector<std::string> file_keys, model_keys;
  for (const auto& e : sd) file_keys.push_back(e.key());
  for (const auto& e : ddp::model_state_dict(*net)) model_keys.push_back(e.key());
  EXPECT_EQ(file_keys, model_keys);
  ddp::load_model_state_dict(*net, sd);
  EXPECT_EQ(net->bn1->num_batches_tracked.item<int64_t>(), 1);

  const auto io = ddp::read_state_dict(dir.file("io.pt"));
  net->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor y = net->forward(io.at("x"));
  EXPECT_TRUE(ddp_test::same_bits(y, io.at("y")))
      << "C++ output differs from Python's by up to " << max_diff(y, io.at("y"));

  // A one-entry dict is pickled with SETITEM, which that unpickler lacks too.
  const auto one = ddp::read_state_dict(dir.file("one.pt"));
  ASSERT_EQ(one.size(), 1u);
  EXPECT_TRUE(ddp_test::same_bits(one.at("only"), at::arange(5)));
}

}  // namespace checkpoint_python_test
