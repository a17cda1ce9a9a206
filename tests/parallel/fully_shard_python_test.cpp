// ddp::fully_shard against PyTorch's own FSDP2 (torch.distributed.fsdp.fully_shard, on
// CPUs with Gloo): the same transformer, the same initial weights and batches, fully_shard
// on each block and on the root, Adam for 10 steps at 3 ranks (so that shards are uneven
// and padded). The full parameters must agree within 1e-5. And HSDP: both on a 2 x 2 mesh
// (replicate, shard), PyTorch's fully_shard(mesh=init_device_mesh("cpu", (2, 2))).

#include "parallel/ddp_test_util.h"
#include "parallel/fsdp_test_models.h"
#include "support/util.h"

#include <ddp/distributed/device_mesh.h>
#include <ddp/fsdp/fully_shard.h>

#include <torch/optim/adam.h>

#include <cstdio>
#include <fstream>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace fully_shard_python_test {

namespace {

constexpr int64_t kPerRank = 2;
constexpr int kSteps = 10;

at::Tensor flat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> parts;
  for (const auto& t : ts) parts.push_back(t.detach().reshape({-1}).to(at::kFloat));
  return at::cat(parts);
}

// Trains on `world` ranks, sharded over all of them (replicas == 1) or HSDP on a
// (replicas, world / replicas) mesh, in C++ and in PyTorch, and compares the results.
void compare(int kWorld, int replicas) {
  ddp_test::TempDir dir;
  ddp_test::TinyGptImpl init_model;
  ddp_test::init_params(init_model, 77);
  const at::Tensor init = flat(init_model.parameters());
  ddp_test::write_bytes(dir.file("init.bin"), init);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(78);
  const at::Tensor x =
      at::randint(ddp_test::kVocab, {kSteps, kWorld * kPerRank, ddp_test::kCtx}, gen, at::kLong);
  const at::Tensor y =
      at::randint(ddp_test::kVocab, {kSteps, kWorld * kPerRank, ddp_test::kCtx}, gen, at::kLong);
  ddp_test::write_bytes(dir.file("x.bin"), x);
  ddp_test::write_bytes(dir.file("y.bin"), y);

  std::string output;
  const int rc =
      ddp_test::run_command(std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                                "/tests/parallel/python/fsdp_peer.py " + dir.path() + " " +
                                std::to_string(kWorld) + " " + std::to_string(kPerRank) + " " +
                                std::to_string(kSteps) + " " + std::to_string(replicas) + " 2>&1",
                            &output);
  if (rc == 3) GTEST_SKIP() << output;
  ASSERT_EQ(rc, 0) << output;
  const at::Tensor py = ddp_test::read_floats(dir.file("py.bin"), {init.numel()});

  at::Tensor cpp;
  ddp_test::run_thread_groups(
      kWorld,
      [&](ddp::ProcessGroup& pg) {
        auto model = std::make_shared<ddp_test::TinyGptImpl>();
        {
          at::NoGradGuard no_grad;
          int64_t offset = 0;
          for (auto& p : model->parameters()) {
            p.copy_(init.slice(0, offset, offset + p.numel()).view_as(p));
            offset += p.numel();
          }
        }
        auto opts = ddp::FullyShardOptions().process_group(ddp_test::borrow(pg));
        if (replicas > 1) {
          opts = ddp::FullyShardOptions().mesh(
              ddp::DeviceMesh("cpu",
                              at::arange(kWorld, at::kLong).view({replicas, kWorld / replicas}),
                              {"replicate", "shard"}, ddp_test::borrow(pg)));
        }
        for (size_t i = 0; i < model->blocks->size(); ++i) {
          ddp::fully_shard(model->blocks->ptr<ddp_test::BlockImpl>(i), opts);
        }
        auto fsdp = ddp::fully_shard(model, opts);
        torch::optim::Adam opt(fsdp->parameters(), torch::optim::AdamOptions(1e-2));
        const int r = pg.rank();
        for (int s = 0; s < kSteps; ++s) {
          at::Tensor xs = x[s].slice(0, r * kPerRank, (r + 1) * kPerRank);
          at::Tensor ys = y[s].slice(0, r * kPerRank, (r + 1) * kPerRank);
          at::Tensor out = fsdp(xs);
          at::cross_entropy_loss(out.reshape({-1, ddp_test::kVocab}), ys.reshape({-1})).backward();
          opt.step();
          opt.zero_grad();
        }
        auto state = ddp::full_state_dict(*fsdp);
        if (r == 0) {
          std::vector<at::Tensor> params;
          for (const auto& item : model->named_parameters()) params.push_back(state.at(item.key()));
          cpp = flat(params);
        }
      },
      std::chrono::seconds(120));

  const double diff = (cpp - py).abs().max().item<double>();
  EXPECT_LE(diff, 1e-5) << "ddp::fully_shard and PyTorch's FSDP2 differ by up to " << diff
                        << " after " << kSteps << " Adam steps (" << kWorld << " ranks, "
                        << replicas << " replicas)";
  std::printf(
      "fully_shard vs FSDP2 (%d ranks, %d replicas): max |difference| %.3g after %d steps\n",
      kWorld, replicas, diff, kSteps);
  // The comparison means something only if training moved the weights.
  EXPECT_GT((py - init).abs().max().item<double>(), 1e-2);
}

TEST(FullyShardPython, MatchesTorchFsdp2) { compare(3, 1); }

TEST(FullyShardPython, HsdpMatchesTorchHsdp) { compare(4, 2); }

}  // namespace

}  // namespace fully_shard_python_test
