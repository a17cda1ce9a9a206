// One training configuration of bench/run-fsdp: DDP, ZeRO-1 or fully_shard on a wide
// block model (about 200 MB of fp32 parameters by default) with Adam, for the memory and
// time tables of docs/fsdp.md. One mode per launch, so that the peak RSS is the mode's.
//
//   ddprun --nproc-per-node 2 --no-prefix -- bench_fsdp MODE [--backend B] [--dim D]
//       [--blocks B] [--batch N] [--iters I] [--warmup W]
//
// MODE: ddp, zero or fsdp. Prints one line of JSON on rank 0: the median milliseconds
// per iteration (forward, backward, optimizer step), the largest rank's peak RSS, its
// parameter, gradient and optimizer-state bytes, the largest unit's full bytes, the RSS
// after init_process_group (the baseline) and after the model was built, the
// activations, a step's peak above what it started with (LibTorch's CPU allocations,
// counted with ddp::enable_cpu_allocation_counting, plus ddp-cpp's reused buffers), and
// what glibc holds freed. --timeline PATH writes each rank's figures at every event of
// every step (fully_shard's unshard, reshard, reduce-scatter; forward, backward,
// optimizer) to PATH.rankR.jsonl.

#include <ddp/distributed/memory.h>
#include <ddp/distributed/process_group.h>
#include <ddp/optim/zero_redundancy_optimizer.h>
#include <ddp/parallel/distributed_data_parallel.h>
#include <ddp/fsdp/fully_shard.h>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

/// A block: Linear(D, 4D), GELU, Linear(4D, D), with a residual connection.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t dim)
      : up(register_module("up", torch::nn::Linear(dim, 4 * dim))),
        down(register_module("down", torch::nn::Linear(4 * dim, dim))) {}
  at::Tensor forward(at::Tensor x) { return x + down(at::gelu(up(x))); }
  torch::nn::Linear up, down;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

/// --timeline: the memory figures at each event of a step, one JSON line each.
class Timeline {
 public:
  void open(const std::string& path) { out_.open(path); }
  bool on() const { return out_.is_open(); }
  void step(int64_t it) {
    step_ = it;
    t0_ = Clock::now();
  }
  void mark(const std::string& event, const std::string& unit = "") {
    if (!on()) return;
    const ddp::CpuMemoryStats s = ddp::cpu_memory_stats();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0_).count();
    std::lock_guard<std::mutex> lock(mutex_);
    out_ << "{\"step\": " << step_ << ", \"ms\": " << ms << ", \"event\": \"" << event
         << "\", \"unit\": \"" << unit << "\", \"rss\": " << s.rss
         << ", \"allocated\": " << s.allocated << ", \"malloc_free\": " << s.malloc_free
         << ", \"buffers_in_use\": " << s.buffers_in_use
         << ", \"buffers_cached\": " << s.buffers_cached << "}\n";
  }

 private:
  std::ofstream out_;
  std::mutex mutex_;
  int64_t step_ = -1;
  Clock::time_point t0_ = Clock::now();
};

int64_t max_over_ranks(int64_t v) {
  at::Tensor t = at::full({1}, v, at::kLong);
  ddp::all_reduce(t, ddp::ReduceOp::MAX);
  return t.item<int64_t>();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"One configuration of the fully_shard benchmark (bench/run-fsdp)"};
  std::string mode, backend;
  int64_t dim = 1024, blocks = 6, batch = 16, iters = 6, warmup = 2;
  std::string timeline_path;
  bool caching = false;
  app.add_option("mode", mode, "ddp, zero or fsdp")
      ->required()
      ->check(CLI::IsMember({"ddp", "zero", "fsdp"}));
  app.add_option("--backend", backend, "gloo or shm; empty: the library's choice")
      ->check(CLI::IsMember({"", "gloo", "shm", "nccl"}));
  app.add_option("--dim", dim, "Block width D")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--blocks", blocks, "Blocks")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "Rows per rank and iteration")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "Timed iterations")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "Untimed iterations first")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--timeline", timeline_path,
                 "Write each rank's memory at every event of every step to PATH.rankR.jsonl");
  app.add_flag(
      "--caching-allocator", caching,
      "LibTorch's large CPU tensors from ddp-cpp's cache (ddp::enable_cpu_caching_allocator)");
  CLI11_PARSE(app, argc, argv);

  try {
    ddp::ProcessGroupGuard group(ddp::InitOptions().backend(backend));
    const int rank = ddp::get_rank();
    // Counted from here: the baseline is the process after init_process_group, before the
    // model exists.
    ddp::enable_cpu_allocation_counting();
    if (caching && !ddp::enable_cpu_caching_allocator()) {
      throw std::runtime_error("--caching-allocator: the CPU allocator could not be wrapped");
    }
    const ddp::CpuMemoryStats baseline = ddp::cpu_memory_stats();
    Timeline timeline;
    if (!timeline_path.empty()) {
      timeline.open(timeline_path + ".rank" + std::to_string(rank) + ".jsonl");
      ddp::set_fully_shard_observer([&timeline](ddp::FullyShardEvent e, const std::string& unit) {
        timeline.mark(ddp::to_string(e), unit);
      });
    }
    timeline.mark("baseline");
    torch::manual_seed(0);
    auto model = torch::nn::Sequential();
    for (int64_t i = 0; i < blocks; ++i) model->push_back(std::make_shared<BlockImpl>(dim));
    int64_t unit_bytes = 0;
    for (const auto& p : model->ptr<BlockImpl>(0)->parameters()) unit_bytes += bytes_of(p);

    std::function<at::Tensor(const at::Tensor&)> forward;
    std::shared_ptr<torch::nn::Module> wrapped;
    std::unique_ptr<torch::optim::Optimizer> opt;
    ddp::ZeroRedundancyOptimizer* zero = nullptr;
    if (mode == "fsdp") {
      for (int64_t i = 0; i < blocks; ++i) ddp::fully_shard(model->ptr<BlockImpl>(i));
      auto root = ddp::fully_shard(model.ptr());
      wrapped = root.ptr();
      forward = [root](const at::Tensor& x) mutable { return root(x); };
    } else {
      auto dmodel = ddp::DistributedDataParallel(model);
      wrapped = dmodel.ptr();
      forward = [dmodel](const at::Tensor& x) mutable { return dmodel->forward(x); };
    }
    if (mode == "zero") {
      auto z = std::make_unique<ddp::ZeroRedundancyOptimizer>(model->parameters(),
                                                              torch::optim::AdamOptions(1e-4));
      zero = z.get();
      opt = std::move(z);
    } else {
      opt = std::make_unique<torch::optim::Adam>(model->parameters(),
                                                 torch::optim::AdamOptions(1e-4));
    }

    std::vector<double> ms;
    timeline.mark("built");
    const ddp::CpuMemoryStats built = ddp::cpu_memory_stats();
    ddp::reset_peak_cpu_memory_stats();
    // Per timed step: the activations (what forward left allocated) and the step's peak
    // above what it started with (LibTorch's allocations and ddp-cpp's buffers).
    int64_t activations = 0, step_transient = 0;
    for (int64_t it = 0; it < warmup + iters; ++it) {
      at::Tensor x = torch::randn({batch, dim});
      timeline.step(it);
      timeline.mark("step_start");
      const ddp::CpuMemoryStats start = ddp::cpu_memory_stats();
      ddp::reset_peak_cpu_memory_stats();
      const auto t0 = Clock::now();
      at::Tensor loss = forward(x).pow(2).mean();
      timeline.mark("forward_done");
      const int64_t held = ddp::cpu_memory_stats().allocated - start.allocated;
      loss.backward();
      timeline.mark("backward_done");
      opt->step();
      timeline.mark("optimizer_done");
      // Zeroed, not freed, so that the gradients' memory stays counted (and LibTorch
      // 1.13's zero_grad() has no set_to_none).
      for (auto& p : model->parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
      const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (it >= warmup) {
        ms.push_back(t);
        const ddp::CpuMemoryStats s = ddp::cpu_memory_stats();
        activations = std::max(activations, held);
        step_transient = std::max(step_transient, s.peak_allocated - start.allocated +
                                                      s.peak_buffers_in_use - start.buffers_in_use);
      }
    }
    ddp::set_fully_shard_observer(nullptr);
    // Gradients were zeroed, not freed, so they still count: what a step holds.
    int64_t params = 0, grads = 0;
    for (const auto& p : model->parameters()) {
      params += bytes_of(p);
      grads += bytes_of(p.grad());
    }
    const int64_t state = zero ? zero->local_state_bytes() : ddp::optimizer_state_bytes(*opt);
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    const int64_t rss = static_cast<int64_t>(usage.ru_maxrss) * 1024;
    const ddp::CpuMemoryStats end = ddp::cpu_memory_stats();
    std::vector<double> times = {median(ms)};
    at::Tensor t = at::tensor(times, at::kDouble);
    ddp::all_reduce(t, ddp::ReduceOp::MAX);
    const int64_t max_rss = max_over_ranks(rss), max_params = max_over_ranks(params),
                  max_grads = max_over_ranks(grads), max_state = max_over_ranks(state);
    // The baseline (after init_process_group, before the model), the process after the
    // model was built and wrapped, and the steps' own figures.
    const int64_t max_base = max_over_ranks(baseline.rss),
                  max_built_rss = max_over_ranks(built.rss),
                  max_activations = max_over_ranks(activations),
                  max_transient = max_over_ranks(step_transient),
                  max_malloc_free = max_over_ranks(end.malloc_free),
                  max_buffers = max_over_ranks(end.buffers_in_use + end.buffers_cached);
    if (rank == 0) {
      int64_t numel = 0;
      for (const auto& p : model->parameters()) numel += p.numel();
      std::printf("{\"mode\": \"%s\", \"backend\": \"%s\", \"world\": %d, \"ms\": %.3f, "
                  "\"peak_rss\": %lld, \"params\": %lld, \"grads\": %lld, \"optimizer\": %lld, "
                  "\"unit_bytes\": %lld, \"baseline_rss\": %lld, \"built_rss\": %lld, "
                  "\"activations\": %lld, \"step_transient\": %lld, \"malloc_free\": %lld, "
                  "\"buffers\": %lld}\n",
                  mode.c_str(), ddp::default_group()->backend().c_str(), ddp::get_world_size(),
                  t.item<double>(), static_cast<long long>(max_rss),
                  static_cast<long long>(max_params), static_cast<long long>(max_grads),
                  static_cast<long long>(max_state), static_cast<long long>(unit_bytes),
                  static_cast<long long>(max_base), static_cast<long long>(max_built_rss),
                  static_cast<long long>(max_activations), static_cast<long long>(max_transient),
                  static_cast<long long>(max_malloc_free), static_cast<long long>(max_buffers));
      std::fflush(stdout);
    }
    ddp::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fsdp: error: %s\n", e.what());
    return 1;
  }
}
