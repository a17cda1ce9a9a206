#pragma once

// Timing of collectives for the micro-benchmarks (bench_allreduce, bench_collectives):
// medians, and a collective's time as its slowest rank's median.

#include <ddp/distributed/process_group.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Median seconds of `call` (a collective on `pg`) over `iters` calls, each after a
/// barrier, following `warmup` calls: the slowest rank's median, since a collective ends
/// when its last rank is done.
inline double time_calls(ddp::ProcessGroup& pg, int iters, const std::function<void()>& call,
                         int warmup) {
  for (int i = 0; i < warmup; ++i) call();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    pg.barrier();
    const auto start = std::chrono::steady_clock::now();
    call();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  auto m = at::full({1}, median(times), at::kDouble);
  pg.all_reduce(m, ddp::ReduceOp::MAX);
  return m.item<double>();
}

}  // namespace bench
