// ZeroRedundancyOptimizer against the unsharded optimizer, both behind
// DistributedDataParallel: time per training iteration and optimizer state per rank,
// for a wide MLP whose optimizer step is a large part of the iteration.
//
// Run under a launcher:
//   ddprun --nproc-per-node 2 --no-prefix -- bench_zero [WIDTH [LAYERS [ITERS [REPEATS]]]]
//
// Modes: "plain" (DDP + torch::optim::Adam), "zero all-gather" and "zero broadcast"
// (DDP + ZeroRedundancyOptimizer over Adam, with each ParameterSync). Each repeat times
// ITERS iterations after a warm-up, the modes taking turns; the table shows the median
// over repeats and the ratio to plain. A second table times the collectives alone on the model's numel:
// all-reduce (what DDP does) against reduce-scatter + all-gather (what a ZeRO that
// reduce-scatters gradients would do).

#include <ddp/parallel/distributed_data_parallel.h>
#include <ddp/optim/zero_redundancy_optimizer.h>
#include <ddp/distributed/process_group.h>

#include "bench_args.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

torch::nn::Sequential wide_mlp(int64_t width, int64_t layers) {
  torch::nn::Sequential net;
  net->push_back(torch::nn::Linear(64, width));
  for (int64_t i = 0; i < layers; ++i) {
    net->push_back(torch::nn::ReLU());
    net->push_back(torch::nn::Linear(width, width));
  }
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Linear(width, 8));
  return net;
}

// One training setup: a model behind DDP with its optimizer.
struct Setup {
  std::string mode;
  torch::nn::Sequential model{nullptr};
  ddp::DistributedDataParallel<torch::nn::Sequential> dmodel{nullptr};
  std::unique_ptr<torch::optim::Optimizer> opt;
  ddp::ZeroRedundancyOptimizer* zero = nullptr;
  std::vector<double> ms;  // per repeat, per iteration

  Setup(std::string mode_, int64_t width, int64_t layers) : mode(std::move(mode_)) {
    torch::manual_seed(0);
    model = wide_mlp(width, layers);
    dmodel = ddp::DistributedDataParallel(model);
    const auto options = torch::optim::AdamOptions(1e-4);
    if (mode == "plain") {
      opt = std::make_unique<torch::optim::Adam>(model->parameters(), options);
      return;
    }
    auto z = std::make_unique<ddp::ZeroRedundancyOptimizer>(
        model->parameters(), options,
        ddp::ZeroRedundancyOptimizerOptions().parameter_sync(mode == "zero broadcast"
                                                                 ? ddp::ParameterSync::kBroadcast
                                                                 : ddp::ParameterSync::kAllGather));
    zero = z.get();
    opt = std::move(z);
  }

  void iteration(const at::Tensor& x, const at::Tensor& y) {
    opt->zero_grad();
    torch::mse_loss(dmodel->forward(x), y).backward();
    opt->step();
  }

  int64_t state_bytes() const {
    return zero ? zero->local_state_bytes() : ddp::optimizer_state_bytes(*opt);
  }
};

double time_collective(int repeats, const std::function<void()>& f) {
  for (int i = 0; i < 2; ++i) f();
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    ddp::barrier();
    const auto start = Clock::now();
    f();
    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return median(times);
}

}  // namespace

constexpr const char* kUsage =
    "usage: ddprun --nproc-per-node N --no-prefix -- bench_zero [WIDTH [LAYERS [ITERS "
    "[REPEATS]]]]\n"
    "  WIDTH    hidden width of the MLP (default 1024)\n"
    "  LAYERS   hidden layers (default 6)\n"
    "  ITERS    optimizer steps per measurement (default 5)\n"
    "  REPEATS  measurements, interleaved; the median is reported (default 7)\n";

int main(int argc, char** argv) {
  const std::string program = "bench_zero";
  bench::handle_help(argc, argv,
                     "ZeroRedundancyOptimizer against Adam behind DDP: memory and time.", kUsage);
  bench::at_most(program, argc, 4, kUsage);
  const int64_t width = argc > 1 ? bench::positive_arg(program, "WIDTH", argv[1], kUsage) : 1024;
  const int64_t layers = argc > 2 ? bench::positive_arg(program, "LAYERS", argv[2], kUsage) : 6;
  const int iters =
      argc > 3 ? static_cast<int>(bench::positive_arg(program, "ITERS", argv[3], kUsage)) : 5;
  const int repeats =
      argc > 4 ? static_cast<int>(bench::positive_arg(program, "REPEATS", argv[4], kUsage)) : 7;
  at::set_num_threads(1);
  ddp::ProcessGroupGuard guard(ddp::InitOptions().backend("gloo"));
  auto pg = ddp::default_group();
  const bool leader = pg->rank() == 0;
  int64_t numel = 0;
  for (const auto& p : wide_mlp(width, layers)->parameters()) numel += p.numel();

  if (leader) {
    std::printf("# ZeRO-1 vs DDP + Adam: %lld parameters (%.1f MB float32), %d ranks (%s), "
                "median of %d repeats of %d iterations\n",
                static_cast<long long>(numel), numel * 4 / 1e6, pg->size(), pg->backend().c_str(),
                repeats, iters);
    std::printf("| mode | ms / iteration | vs plain | optimizer state, largest rank (MB) | "
                "vs plain |\n");
    std::printf("|---|---:|---:|---:|---:|\n");
  }
  // The modes take turns, repeat by repeat, so that a change of machine load reaches
  // all of them alike.
  std::vector<std::unique_ptr<Setup>> setups;
  for (const char* mode : {"plain", "zero all-gather", "zero broadcast"}) {
    setups.push_back(std::make_unique<Setup>(mode, width, layers));
  }
  const at::Tensor x = at::randn({16, 64});
  const at::Tensor y = at::randn({16, 8});
  for (auto& setup : setups) {
    for (int i = 0; i < 3; ++i) setup->iteration(x, y);
  }
  for (int r = 0; r < repeats; ++r) {
    for (auto& setup : setups) {
      ddp::barrier();
      const auto start = Clock::now();
      for (int i = 0; i < iters; ++i) setup->iteration(x, y);
      ddp::barrier();
      setup->ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count() /
                          iters);
    }
  }
  // The largest rank's state: what bounds memory.
  auto largest = [&](int64_t bytes) {
    at::Tensor t = at::full({1}, bytes, at::kLong);
    pg->all_reduce(t, ddp::ReduceOp::MAX);
    return t.item<int64_t>();
  };
  const double plain_ms = median(setups[0]->ms);
  const int64_t plain_bytes = largest(setups[0]->state_bytes());
  for (auto& setup : setups) {
    const double ms = median(setup->ms);
    const int64_t bytes = largest(setup->state_bytes());
    if (leader) {
      std::printf("| %s | %.2f | %.2f | %.1f | %.2f |\n", setup->mode.c_str(), ms, ms / plain_ms,
                  bytes / 1e6, static_cast<double>(bytes) / static_cast<double>(plain_bytes));
    }
  }
  setups.clear();

  const int64_t world = pg->size();
  const int64_t chunk = (numel + world - 1) / world;
  at::Tensor full = at::randn({chunk * world});
  at::Tensor part = at::empty({chunk});
  const double all_reduce_ms = time_collective(repeats, [&] { pg->all_reduce(full); });
  const double reduce_scatter_ms =
      time_collective(repeats, [&] { pg->reduce_scatter_tensor(part, full); });
  const double all_gather_ms =
      time_collective(repeats, [&] { pg->all_gather_into_tensor(full, part); });
  std::vector<at::Tensor> chunks;
  for (int64_t r = 0; r < world; ++r) chunks.push_back(at::randn({chunk}));
  const double broadcasts_ms = time_collective(repeats, [&] {
    std::vector<ddp::Work> works;
    for (int64_t r = 0; r < world; ++r) {
      std::vector<at::Tensor> one{chunks[static_cast<size_t>(r)]};
      works.push_back(pg->broadcast_async(one, static_cast<int>(r)));
    }
    for (auto& w : works) w.wait();
  });
  if (leader) {
    std::printf("\n| collective on %lld floats | ms | vs all-reduce |\n",
                static_cast<long long>(chunk * world));
    std::printf("|---|---:|---:|\n");
    std::printf("| all_reduce | %.2f | 1.00 |\n", all_reduce_ms);
    std::printf("| reduce_scatter_tensor | %.2f | %.2f |\n", reduce_scatter_ms,
                reduce_scatter_ms / all_reduce_ms);
    std::printf("| all_gather_into_tensor | %.2f | %.2f |\n", all_gather_ms,
                all_gather_ms / all_reduce_ms);
    std::printf("| a broadcast from each rank (1/%lld each) | %.2f | %.2f |\n",
                static_cast<long long>(world), broadcasts_ms, broadcasts_ms / all_reduce_ms);
    std::printf("| reduce_scatter + all_gather | %.2f | %.2f |\n",
                reduce_scatter_ms + all_gather_ms,
                (reduce_scatter_ms + all_gather_ms) / all_reduce_ms);
  }
  return 0;
}
