// A checkpoint saved by two ranks with ZeroRedundancyOptimizer is, to PyTorch, the
// checkpoint of a plain torch.optim.Adam: torch.load reads it, Adam.load_state_dict
// takes its optimizer state, and Python's next step is the C++ plain Adam's next step
// from the same file. The Python side is tests/serialize/python/checkpoint_reference.py.

#include "serialize/checkpoint_test_util.h"
#include "support/harness.h"

#include <ddp/serialize/checkpoint.h>
#include <ddp/parallel/distributed_data_parallel.h>
#include <ddp/optim/zero_redundancy_optimizer.h>
#include <ddp/data/distributed_sampler.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace zero_python_test {

using nlohmann::json;

TEST(ZeroCheckpointPythonTest, PythonLoadsAZeroCheckpointAsAPlainAdam) {
  constexpr int kWorld = 2;
  ddp_test::TempDir dir;
  std::vector<ddp_test::Net> nets;
  for (int r = 0; r < kWorld; ++r) nets.push_back(ddp_test::make_net(1));
  ddp_test::run_thread_groups(kWorld, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    ddp_test::Net net = nets[static_cast<size_t>(r)];
    auto group = ddp_test::borrow(pg);
    auto dnet =
        ddp::DistributedDataParallel(net,
                                     ddp::DistributedDataParallelOptions().process_group(group));
    ddp::ZeroRedundancyOptimizer zero(net->parameters(),
                                      torch::optim::AdamOptions(0.05).weight_decay(1e-4),
                                      ddp::ZeroRedundancyOptimizerOptions().process_group(group));
    for (int64_t step = 0; step < 2; ++step) {
      const auto b = ddp_test::batch_for(step);
      zero.zero_grad();
      torch::mse_loss(dnet->forward(b.first.narrow(0, 2 * r, 2)), b.second.narrow(0, 2 * r, 2))
          .backward();
      zero.step();
    }
    ddp::DistributedSampler sampler(
        10, ddp::DistributedSamplerOptions().num_replicas(kWorld).rank(r).seed(4));
    ddp::CheckpointExtra extra(c10::StringType::get(), c10::AnyType::get());
    extra.insert("note", std::string("from ZeRO"));
    extra.insert("x", ddp_test::batch_for(2).first);
    extra.insert("y", ddp_test::batch_for(2).second);
    ddp::Checkpoint ckpt(*net);
    // With RNG states: the Python side reads rng[0].
    ckpt.optimizer(&zero).sampler(&sampler).process_group(group);
    ddp::save_checkpoint(dir.file("c.pt"), ckpt.epoch(1).step(2).extra(extra));
  });

  std::string output;
  const std::string script = std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                             "/tests/serialize/python/checkpoint_reference.py";
  const int rc = ddp_test::run_command(script + " continue " + dir.file("c.pt") + " adam " +
                                           dir.file("py.pt") + " " + dir.file("report.json"),
                                       &output);
  ASSERT_EQ(rc, 0) << output;
  std::ifstream in(dir.file("report.json"));
  const json report = json::parse(in);
  EXPECT_EQ(report["type"], "dict");
  EXPECT_EQ(report["world_size"], kWorld);
  EXPECT_EQ(report["note"], "from ZeRO");
  EXPECT_EQ(report["optimizer_type"], "Adam");
  EXPECT_EQ(report["param_names"], report["python_param_names"]);
  EXPECT_DOUBLE_EQ(report["lr"].get<double>(), 0.05) << "Python did not take the saved lr";
  EXPECT_EQ(report["state_entries"], 8) << "the state of some shard is missing";

  // The C++ plain Adam resumes from the same file and takes the same step.
  ddp_test::Net net = ddp_test::make_net(99);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(123.0));
  ddp::Checkpoint ckpt(*net);
  ddp::load_checkpoint(dir.file("c.pt"), ckpt.optimizer(&adam).rng(false));
  ddp_test::train(net, adam, 2, 3);
  const auto python = ddp::read_state_dict(dir.file("py.pt"));
  for (const auto& e : ddp::model_state_dict(*net)) {
    ASSERT_TRUE(python.contains(e.key())) << e.key();
    const at::Tensor p = python.at(e.key());
    // As in tests/serialize/checkpoint_python_test.cpp: 2.x's Python Adam and LibTorch's
    // round about an ulp apart; a lost moment would move a step of lr 0.05 by ~1e-2.
    EXPECT_LE((e.value().to(at::kDouble) - p.to(at::kDouble)).abs().max().item<double>(), 1e-7)
        << e.key();
  }
}

}  // namespace zero_python_test
