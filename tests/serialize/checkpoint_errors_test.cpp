// Checkpoint loading refuses what does not fit, and a refusal changes nothing: model,
// optimizer, sampler and RNG are exactly as before.

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
namespace checkpoint_errors_test {

using ddp::Checkpoint;
using ddp_test::error_of;
using ddp_test::make_net;
using ddp_test::make_optimizer;
using ddp_test::Net;
using ddp_test::same_bits;
using ddp_test::snapshot;
using ddp_test::train;
using ddp_test::unchanged;

class CheckpointErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    net = make_net(1);
    opt = make_optimizer("sgd", net, 0.1);
    train(net, *opt, 0, 2);
    sampler = std::make_unique<ddp::DistributedSampler>(
        40, ddp::DistributedSamplerOptions().num_replicas(2).rank(0));
    sampler->next(4);
    ddp::save_checkpoint(dir.file("good.pt"),
                         Checkpoint(*net).optimizer(opt.get()).sampler(sampler.get()));
    // The target: another model/optimizer/sampler whose state must survive a refusal.
    target = make_net(2);
    target_opt = make_optimizer("sgd", target, 0.1);
    train(target, *target_opt, 5, 6);
    target_sampler = std::make_unique<ddp::DistributedSampler>(
        40, ddp::DistributedSamplerOptions().num_replicas(2).rank(0));
    target_sampler->next(2);
    before = snapshot(*target);
  }

  // Sum of every momentum buffer: changes if any optimizer state is touched.
  double momentum_sum() const {
    double sum = 0;
    for (const auto& entry : target_opt->state()) {
      sum += static_cast<const torch::optim::SGDParamState&>(*entry.second)
                 .momentum_buffer()
                 .sum()
                 .item<double>();
    }
    return sum;
  }

  std::string load(const std::string& path) {
    Checkpoint ck(*target);
    ck.optimizer(target_opt.get()).sampler(target_sampler.get());
    const double momentum_before = momentum_sum();
    torch::manual_seed(77);
    const std::string msg = error_of([&] { ddp::load_checkpoint(path, ck); });
    const at::Tensor drawn = torch::rand({3});
    // Nothing changed: model, optimizer hyperparameters and state, sampler, RNG.
    EXPECT_TRUE(unchanged(*target, before)) << "the model changed on: " << msg;
    EXPECT_EQ(target_sampler->position(), 2u) << "the sampler changed on: " << msg;
    EXPECT_EQ(target_opt->param_groups()[0].options().get_lr(), 0.1) << msg;
    EXPECT_EQ(momentum_sum(), momentum_before) << "the optimizer state changed on: " << msg;
    torch::manual_seed(77);
    EXPECT_TRUE(same_bits(drawn, torch::rand({3}))) << "the RNG changed on: " << msg;
    return msg;
  }

  std::string write_bytes(const std::string& name, const std::string& bytes) {
    std::ofstream(dir.file(name), std::ios::binary) << bytes;
    return dir.file(name);
  }

  std::string good_bytes() {
    std::ifstream in(dir.file("good.pt"), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  ddp_test::TempDir dir;
  Net net{nullptr}, target{nullptr};
  std::unique_ptr<torch::optim::Optimizer> opt, target_opt;
  std::unique_ptr<ddp::DistributedSampler> sampler, target_sampler;
  std::vector<at::Tensor> before;
};

TEST_F(CheckpointErrorTest, MissingFile) {
  const std::string msg = load(dir.file("nope.pt"));
  EXPECT_NE(msg.find("nope.pt'): no such file"), std::string::npos) << msg;
}

TEST_F(CheckpointErrorTest, TruncatedFile) {
  const std::string bytes = good_bytes();
  for (size_t keep : {size_t{0}, size_t{100}, bytes.size() / 2, bytes.size() - 1}) {
    const std::string msg = load(write_bytes("cut.pt", bytes.substr(0, keep)));
    EXPECT_NE(msg.find("the file is truncated or corrupt (" + std::to_string(keep) + " bytes"),
              std::string::npos)
        << msg;
  }
}

// A flipped bit inside a tensor's bytes or inside the pickled structure is caught (the
// zip records carry CRC-32s), not loaded as a silently different value.
TEST_F(CheckpointErrorTest, CorruptBytes) {
  const std::string bytes = good_bytes();
  const at::Tensor w = net->conv1->weight.detach().contiguous();
  const std::string weight_bytes(static_cast<const char*>(w.data_ptr()), w.nbytes());
  for (const std::string& needle : {weight_bytes, std::string("momentum_buffer")}) {
    const size_t at = bytes.find(needle);
    ASSERT_NE(at, std::string::npos);
    std::string bad = bytes;
    bad[at + needle.size() / 2] = static_cast<char>(bad[at + needle.size() / 2] ^ 0x10);
    const std::string msg = load(write_bytes("bad.pt", bad));
    EXPECT_NE(msg.find("truncated or corrupt"), std::string::npos) << msg;
  }
}

// Archives crafted past their CRC-32s (names are not covered by them): two records of
// one name, no version record. Each is refused with what is wrong, before LibTorch's own
// reader sees it (Note [What LibTorch's reader requires]).
TEST_F(CheckpointErrorTest, CraftedArchives) {
  const std::string bytes = good_bytes();
  const auto replaced = [&](const std::string& from, const std::string& to) {
    std::string out = bytes;
    size_t n = 0;
    for (size_t at = out.find(from); at != std::string::npos; at = out.find(from, at + 1), ++n) {
      out.replace(at, from.size(), to);
    }
    EXPECT_GE(n, 2u) << from;  // the local header and the central directory
    return out;
  };
  std::string msg = load(write_bytes("dup.pt", replaced("/data/1", "/data/0")));
  EXPECT_NE(msg.find("two records are named '"), std::string::npos) << msg;
  msg = load(write_bytes("noversion.pt", replaced("/version", "/versioN")));
  EXPECT_NE(msg.find("version'; a torch.save or ddp::save_checkpoint file has all its records "
                     "in one folder, with a version record"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(unchanged(*target, before));
}

TEST_F(CheckpointErrorTest, OtherArchitecture) {
  // Same structure but a wider head: a shape mismatch, named.
  struct WideImpl : torch::nn::Module {
    WideImpl() {
      register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)));
      register_module("bn1", torch::nn::BatchNorm2d(4));
      register_module("head", torch::nn::Sequential(torch::nn::Linear(64, 8), torch::nn::ReLU(),
                                                    torch::nn::Linear(8, 5)));
    }
  };
  auto wide = std::make_shared<WideImpl>();
  ddp::save_checkpoint(dir.file("wide.pt"), Checkpoint(*wide));
  Checkpoint ck(*target);
  ck.rng(false);
  const auto before_wide = snapshot(*target);
  const std::string msg = error_of([&] { ddp::load_checkpoint(dir.file("wide.pt"), ck); });
  EXPECT_NE(msg.find("Size mismatch for 'head.2.weight': the checkpoint has shape [5, 8], the "
                     "model has [3, 8]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("wide.pt')"), std::string::npos) << msg;
  EXPECT_TRUE(unchanged(*target, before_wide));
}

TEST_F(CheckpointErrorTest, OtherOptimizerType) {
  auto adam = make_optimizer("adam", target, 0.1);
  Checkpoint ck(*target);
  ck.optimizer(adam.get());
  const std::string msg = error_of([&] { ddp::load_checkpoint(dir.file("good.pt"), ck); });
  EXPECT_NE(msg.find("holds SGD optimizer state, but the optimizer is Adam"), std::string::npos)
      << msg;
  EXPECT_TRUE(unchanged(*target, before));
}

TEST_F(CheckpointErrorTest, OptimizerOverOtherParameters) {
  // An optimizer over the head only: other parameter count in its group.
  torch::optim::SGD head_only(target->head->parameters(), torch::optim::SGDOptions(0.1));
  Checkpoint ck(*target);
  ck.optimizer(&head_only);
  const std::string msg = error_of([&] { ddp::load_checkpoint(dir.file("good.pt"), ck); });
  EXPECT_NE(msg.find("param_groups[0] has 8 parameter(s) in the checkpoint, but 4 in this "
                     "optimizer"),
            std::string::npos)
      << msg;
}

TEST_F(CheckpointErrorTest, MidEpochSamplerFromAnotherWorldSize) {
  ddp::DistributedSampler three(40, ddp::DistributedSamplerOptions().num_replicas(3).rank(1));
  Checkpoint ck(*target);
  ck.sampler(&three).rng(false);
  const std::string msg = error_of([&] { ddp::load_checkpoint(dir.file("good.pt"), ck); });
  // Saved by one process for rank 0 of 2: rank 1's position is unknown, so the samples
  // not yet seen are too.
  EXPECT_NE(msg.find("saved mid-epoch (epoch 0) by 2 ranks, but not every rank saved its "
                     "sampler position"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("Resume with 2 ranks, or from a checkpoint saved at an epoch boundary"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(unchanged(*target, before));

  // At an epoch boundary another world size is fine: only the epoch carries over.
  sampler->set_epoch(6);
  ddp::save_checkpoint(dir.file("boundary.pt"), Checkpoint(*net).sampler(sampler.get()));
  ddp::load_checkpoint(dir.file("boundary.pt"), ck);
  EXPECT_EQ(three.epoch(), 6);
  EXPECT_EQ(three.position(), 0u);
}

TEST_F(CheckpointErrorTest, PartsThatWereNotSaved) {
  ddp::save_checkpoint(dir.file("bare.pt"), Checkpoint(*net).rng(false));
  std::string msg = load(dir.file("bare.pt"));
  EXPECT_NE(msg.find("the checkpoint has no 'optimizer'"), std::string::npos) << msg;
  Checkpoint ck(*target);
  msg = error_of([&] { ddp::load_checkpoint(dir.file("bare.pt"), ck); });
  EXPECT_NE(msg.find("has no 'rng' (it was saved without Checkpoint::rng)"), std::string::npos)
      << msg;
}

TEST_F(CheckpointErrorTest, PlainStateDictIsNotACheckpoint) {
  ddp::save_model_state_dict(*net, dir.file("sd.pt"));
  const std::string msg = load(dir.file("sd.pt"));
  EXPECT_NE(msg.find("not a ddp-cpp checkpoint"), std::string::npos) << msg;
  // read_state_dict reads both kinds.
  EXPECT_EQ(ddp::read_state_dict(dir.file("good.pt")).size(),
            ddp::read_state_dict(dir.file("sd.pt")).size());
}

}  // namespace checkpoint_errors_test
