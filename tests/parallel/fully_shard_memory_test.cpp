// fully_shard's memory bound (docs/fsdp.md, "The memory model"): in real processes,
// with LibTorch's CPU allocations counted (ddp::enable_cpu_allocation_counting) and
// ddp-cpp's reused buffers beside them, the peak of a training step stays within the
// sharded state plus two units unsharded, one unit's full gradients and one
// reduce-scatter in flight, plus the activations and a stated slack. A schedule that
// kept every unit's reduce-scatter input to the end of backward, or every unit's full
// parameters, exceeds it by several units; the test is sized so that one unit more fails.

#include "parallel/ddp_test_util.h"
#include "support/util.h"

#include <ddp/distributed/memory.h>
#include <ddp/fsdp/fully_shard.h>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace fully_shard_memory_test {

using ddp_test::fail;

namespace {

constexpr int64_t kDim = 128;
constexpr int64_t kBlocks = 6;
constexpr int64_t kBatch = 8;

struct WideBlockImpl : torch::nn::Module {
  WideBlockImpl()
      : up(register_module("up", torch::nn::Linear(kDim, 4 * kDim))),
        down(register_module("down", torch::nn::Linear(4 * kDim, kDim))) {}
  at::Tensor forward(at::Tensor x) { return x + down(at::gelu(up(x))); }
  torch::nn::Linear up, down;
};

int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

}  // namespace

// Prints one line "rank R peak P bound B" per step; fails when a step's peak passes the
// bound.
DDP_SCENARIO(fully_shard_memory_bound) {
  const char* env_backend = std::getenv("DDP_TEST_BACKEND");
  const char* backend_name = env_backend ? env_backend : "gloo";
  ddp::ProcessGroupGuard guard(
      ddp::InitOptions().backend(backend_name).timeout(std::chrono::seconds(60)));
  const int r = ddp::get_rank(), world = ddp::get_world_size();
  const bool set_to_none = std::getenv("DDP_TEST_SET_TO_NONE") != nullptr;
  ddp::enable_cpu_allocation_counting();

  torch::manual_seed(0);
  auto model = torch::nn::Sequential();
  for (int64_t i = 0; i < kBlocks; ++i) model->push_back(std::make_shared<WideBlockImpl>());
  int64_t unit = 0;
  for (const auto& p : model->ptr<WideBlockImpl>(0)->parameters()) unit += bytes_of(p);
  for (int64_t i = 0; i < kBlocks; ++i) ddp::fully_shard(model->ptr<WideBlockImpl>(i));
  auto root = ddp::fully_shard(model.ptr());
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));

  for (int step = 0; step < 4; ++step) {
    const at::Tensor x = ddp_test::randn({kBatch, kDim}, 10 * step + r);
    // The sharded gradients this step creates: none where the last step's were kept
    // (zeroed), all of them in the first step and after zero_grad(set_to_none).
    int64_t new_grads = 0;
    for (const auto& p : model->parameters()) {
      if (!p.grad().defined()) new_grads += bytes_of(p);
    }
    const ddp::CpuMemoryStats before = ddp::cpu_memory_stats();
    ddp::reset_peak_cpu_memory_stats();
    at::Tensor out = root(x);
    const int64_t activations = ddp::cpu_memory_stats().allocated - before.allocated;
    out.pow(2).mean().backward();
    out = at::Tensor();
    const ddp::CpuMemoryStats s = ddp::cpu_memory_stats();
    // Above what the step started with (the state, and whatever else was alive then).
    const int64_t peak = s.peak_allocated - before.allocated + s.peak_buffers_in_use;
    // The model: two units unsharded (the running one's full parameters, the next one's
    // all-gather output), one unit's full gradients (autograd's), one reduce-scatter in
    // flight (its input, and its output where gradients are kept), the activations, and
    // the sharded gradients the step creates.
    // On Gloo, two units more, measured: c10d's Gloo collectives copy through a buffer
    // of their own (up to a unit), and a finished collective's tensors are let go by
    // Gloo's worker thread a moment after wait() returns, so a unit's block may still be
    // held when the next is taken.
    const int64_t backend = std::string(backend_name) == "gloo" ? 2 * unit : 0;
    const int64_t bound =
        2 * unit + unit + unit + (unit + world - 1) / world + activations + new_grads + backend;
    // Slack: 5% and 256 KiB for LibTorch's small allocations and the units' padding.
    const int64_t slack = bound / 20 + (256 << 10);
    std::printf(
        "rank %d step %d peak %lld (allocated %lld, buffers %lld) bound %lld slack %lld unit "
        "%lld activations %lld\n",
        r, step, static_cast<long long>(peak),
        static_cast<long long>(s.peak_allocated - before.allocated),
        static_cast<long long>(s.peak_buffers_in_use), static_cast<long long>(bound),
        static_cast<long long>(slack), static_cast<long long>(unit),
        static_cast<long long>(activations));
    std::fflush(stdout);
    if (peak > bound + slack) return fail("a step's peak passed the memory model's bound");
    // A lower bound too, so that a measurement that counts nothing cannot pass: the
    // running unit's full parameters and gradients exist at some point of every step.
    if (peak < 2 * unit) return fail("a step's peak is below two units: nothing was counted");
    opt.step();
    for (auto& p : model->parameters()) {  // zero_grad(set_to_none) by hand: 1.13 has none
      if (!p.grad().defined()) continue;
      if (set_to_none) {
        p.mutable_grad() = at::Tensor();
      } else {
        p.mutable_grad().zero_();
      }
    }
  }
  return 0;
}

struct MemoryCase {
  const char* backend;
  int world;
  bool set_to_none;
};

class FullyShardMemoryTest : public ::testing::TestWithParam<MemoryCase> {};

TEST_P(FullyShardMemoryTest, AStepStaysWithinTheMemoryModel) {
  const MemoryCase c = GetParam();
  ddp_test::ProcessOptions o;
  o.env["DDP_TEST_BACKEND"] = c.backend;
  if (c.set_to_none) o.env["DDP_TEST_SET_TO_NONE"] = "1";
  const auto results = ddp_test::run_processes(c.world, "fully_shard_memory_bound", o);
  ddp_test::expect_all_ok(results);
  for (const auto& res : results) {
    EXPECT_NE(res.output.find("step 3 peak"), std::string::npos) << res.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, FullyShardMemoryTest,
                         ::testing::Values(MemoryCase{"shm", 2, false},
                                           MemoryCase{"gloo", 2, false},
                                           MemoryCase{"gloo", 3, true},
                                           MemoryCase{"shm", 3, true}));

}  // namespace fully_shard_memory_test
