// All-reduce micro-benchmark, nccl-tests style: for each message size, the median time of
// a float32 SUM all-reduce, its algorithm bandwidth (bytes / time) and bus bandwidth
// (algbw * 2(n-1)/n, the bytes each rank's link carries in a ring).
//
// Run under a launcher:  ddprun --nproc-per-node 2 --no-prefix -- bench_allreduce [MIN [MAX [busy]]]
//
// With "busy", every rank also runs one compute thread (a loop of single-threaded
// matrix products) for the whole measurement, the way backward computes while DDP's
// buckets are in flight: the same all-reduce, but sharing the cores with work.

#include <ddp/distributed/process_group.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string human(int64_t bytes) {
  char buf[32];
  if (bytes >= (1 << 20)) {
    std::snprintf(buf, sizeof(buf), "%lld MB", static_cast<long long>(bytes >> 20));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld KB", static_cast<long long>(bytes >> 10));
  }
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t min_bytes = 4 << 10, max_bytes = 64 << 20;
  if (argc > 1) min_bytes = std::atoll(argv[1]);
  if (argc > 2) max_bytes = std::atoll(argv[2]);
  const bool busy = argc > 3 && std::string(argv[3]) == "busy";
  at::set_num_threads(1);
  ddp::ProcessGroupGuard guard(ddp::InitOptions().backend("gloo"));
  auto pg = ddp::default_group();
  const int n = pg->size();
  const bool leader = pg->rank() == 0;
  if (leader) {
    std::printf("# all_reduce (SUM, float32), backend %s, %d ranks%s; median of repeats\n",
                pg->backend().c_str(), n, busy ? ", one compute thread per rank" : "");
    std::printf("| size | time (us) | algbw (GB/s) | busbw (GB/s) |\n");
    std::printf("|---:|---:|---:|---:|\n");
  }
  std::atomic<bool> stop{false};
  std::thread compute;
  if (busy) {
    compute = std::thread([&stop] {
      at::set_num_threads(1);
      auto a = at::rand({256, 256});
      auto b = at::rand({256, 256});
      while (!stop.load(std::memory_order_relaxed)) a = at::mm(a, b).div_(256);
    });
  }
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    auto t = at::ones({bytes / 4}, at::kFloat);
    // Enough repeats for ~0.5 s per size, at least 5, after 3 warm-ups.
    const int iters = static_cast<int>(std::clamp<int64_t>((64 << 20) / bytes, 5, 200));
    for (int i = 0; i < 3; ++i) pg->all_reduce(t);
    std::vector<double> times;
    for (int i = 0; i < iters; ++i) {
      pg->barrier();
      const auto start = std::chrono::steady_clock::now();
      pg->all_reduce(t);
      times.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    // Every rank's median; report the slowest rank's, since a collective ends when the
    // last rank is done.
    auto m = at::full({1}, median(times), at::kDouble);
    pg->all_reduce(m, ddp::ReduceOp::MAX);
    const double sec = m.item<double>();
    const double algbw = static_cast<double>(bytes) / sec / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    if (leader) {
      std::printf("| %s | %.1f | %.3f | %.3f |\n", human(bytes).c_str(), sec * 1e6, algbw, busbw);
      std::fflush(stdout);
    }
  }
  stop = true;
  if (compute.joinable()) compute.join();
  return 0;
}
