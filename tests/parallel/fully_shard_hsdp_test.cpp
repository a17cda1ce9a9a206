// HSDP: fully_shard on a 2 x 2 mesh (replicate, shard) against one process training the
// same MLP on all four ranks' batches with Adam. Also gradient accumulation with
// set_requires_all_reduce(false): the shard groups' sums wait, and the last backward
// all-reduces them.

#include "parallel/ddp_test_util.h"

#include <ddp/distributed/device_mesh.h>
#include <ddp/fsdp/fully_shard.h>

#include <torch/nn/modules/container/functional.h>
#include <torch/optim/adam.h>

namespace fully_shard_hsdp_test {

namespace {

std::shared_ptr<torch::nn::SequentialImpl> make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(7, 13), torch::nn::Functional(at::tanh),
                               torch::nn::Linear(13, 5))
      .ptr();
}

// Rank r's rows of microbatch `m` at step `s`.
at::Tensor batch(int s, int m, int r) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * s + 10 * m + r);
  return at::randn({3, 7}, gen);
}

void train(int accum, const std::string& what) {
  constexpr int kWorld = 4, kSteps = 4;
  // The reference: one process, all ranks' rows; each microbatch's loss is the mean over
  // all of them, as the average of the ranks' means is.
  auto ref = make_mlp();
  ddp_test::init_params(*ref, 5);
  torch::optim::Adam ref_opt(ref->parameters(), torch::optim::AdamOptions(1e-2));
  for (int s = 0; s < kSteps; ++s) {
    ref_opt.zero_grad();
    for (int m = 0; m < accum; ++m) {
      std::vector<at::Tensor> rows;
      for (int r = 0; r < kWorld; ++r) rows.push_back(batch(s, m, r));
      ref->forward(at::cat(rows)).pow(2).mean().backward();
    }
    ref_opt.step();
  }
  ddp_test::run_thread_groups(kWorld, [&](ddp::ProcessGroup& pg) {
    auto world = ddp_test::borrow(pg);
    ddp::DeviceMesh mesh("cpu", at::arange(kWorld, at::kLong).view({2, 2}), {"replicate", "shard"},
                         world);
    auto model = make_mlp();
    ddp_test::init_params(*model, 5);
    auto fsdp = ddp::fully_shard(model, ddp::FullyShardOptions().mesh(mesh));
    torch::optim::Adam opt(fsdp->parameters(), torch::optim::AdamOptions(1e-2));
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      for (int m = 0; m < accum; ++m) {
        fsdp->set_requires_all_reduce(m == accum - 1);
        fsdp->forward(batch(s, m, pg.rank())).pow(2).mean().backward();
      }
      opt.step();
    }
    const auto state = ddp::full_state_dict(*fsdp);
    if (state.empty()) return;  // shard rank 0 of each replica holds it
    for (const auto& item : ref->named_parameters()) {
      ASSERT_TRUE(state.contains(item.key())) << what << ": " << item.key();
      const at::Tensor got = state.at(item.key());
      EXPECT_TRUE(at::allclose(got, item.value(), 1e-5, 1e-5))
          << what << ", rank " << pg.rank() << ": " << item.key() << " differs by "
          << (got - item.value()).abs().max().item<double>();
    }
  });
}

}  // namespace

TEST(FullyShardHsdp, TwoByTwoMeshMatchesOneProcess) { train(1, "hsdp"); }

TEST(FullyShardHsdp, AccumulationWithoutAllReduceMatchesOneProcess) {
  train(3, "hsdp, 3 microbatches");
}

TEST(FullyShardHsdp, ReplicasMustStartEqual) {
  ddp_test::run_thread_groups(4, [](ddp::ProcessGroup& pg) {
    ddp::DeviceMesh mesh("cpu", at::arange(4, at::kLong).view({2, 2}), {"replicate", "shard"},
                         ddp_test::borrow(pg));
    auto model = make_mlp();
    ddp_test::init_params(*model, pg.rank() < 2 ? 5 : 6);  // the replicas differ
    const std::string msg =
        ddp_test::error_of([&] { ddp::fully_shard(model, ddp::FullyShardOptions().mesh(mesh)); });
    EXPECT_NE(msg.find("differ between replica 0 and replica 1"), std::string::npos) << msg;
  });
}

}  // namespace fully_shard_hsdp_test
