// What the collective diagnostics cost: the latency of a small all-reduce (the kind
// whose fixed cost a per-collective overhead would show most) through three groups that
// differ only in their diagnostics, measured in interleaved rounds in one run:
//   bare      DDP_FLIGHT_RECORDER_SIZE=0, debug off: the collective as c10d runs it
//   recorder  the default: every collective numbered and recorded in the flight recorder
//   detail    DDP_DEBUG=detail: every collective's fingerprint checked across ranks
// Reports the median per round of each, and recorder/bare and detail/bare.
//
// Run under ddprun (single host):  ddprun --nproc-per-node 2 --no-prefix -- bench_diagnostics

#include <ddp/distributed/process_group.h>

#include "bench_args.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::shared_ptr<ddp::ProcessGroup> group(const std::string& name, const char* recorder_size,
                                         const char* debug) {
  const char* dir = std::getenv("DDP_RENDEZVOUS_DIR");
  if (dir == nullptr) {
    std::fprintf(stderr, "bench_diagnostics: run it under ddprun on one host\n");
    std::exit(2);
  }
  ::setenv("DDP_FLIGHT_RECORDER_SIZE", recorder_size, 1);
  auto pg = ddp::ProcessGroup::create(ddp::InitOptions().backend("gloo").debug(debug).init_method(
      "file://" + std::string(dir) + "/" + name));
  ::unsetenv("DDP_FLIGHT_RECORDER_SIZE");
  return pg;
}

double cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

struct PerCall {
  double wall_us = 0;  // elapsed, per call
  double cpu_us = 0;   // this process's CPU time (all its threads), per call
};

// Per all-reduce of 4 floats, over `iters` back-to-back calls.
PerCall per_call(ddp::ProcessGroup& pg, int iters) {
  at::Tensor t = at::ones({4});
  pg.barrier();
  const double cpu0 = cpu_us();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) pg.all_reduce(t);
  const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
  return {took.count() / iters, (cpu_us() - cpu0) / iters};
}

}  // namespace

constexpr const char* kUsage =
    "usage: ddprun --nproc-per-node N --no-prefix -- bench_diagnostics [ROUNDS [ITERS]]\n"
    "  ROUNDS  interleaved rounds of the three groups (default 15)\n"
    "  ITERS   all-reduces per group and round (default 400)\n";

int main(int argc, char** argv) {
  const std::string program = "bench_diagnostics";
  bench::handle_help(argc, argv,
                     "What the flight recorder and DDP_DEBUG=detail cost per collective.", kUsage);
  bench::at_most(program, argc, 2, kUsage);
  const int rounds =
      argc > 1 ? static_cast<int>(bench::positive_arg(program, "ROUNDS", argv[1], kUsage)) : 15;
  const int iters =
      argc > 2 ? static_cast<int>(bench::positive_arg(program, "ITERS", argv[2], kUsage)) : 400;
  ::unsetenv("DDP_FLIGHT_RECORDER_DIR");  // measure recording, not files
  auto bare = group("bare", "0", "off");
  auto recorder = group("recorder", "2000", "off");
  auto detail = group("detail", "2000", "detail");
  const bool lead = bare->rank() == 0;

  std::vector<double> bw, rw, dw, bc, rc, dc;
  for (int k = 0; k < 2; ++k) {  // warm-up
    per_call(*bare, iters / 4);
    per_call(*recorder, iters / 4);
  }
  per_call(*detail, 20);
  for (int round = 0; round < rounds; ++round) {
    const PerCall b = per_call(*bare, iters);
    const PerCall r = per_call(*recorder, iters);
    const PerCall d = per_call(*detail, std::max(iters / 20, 10));
    bw.push_back(b.wall_us), bc.push_back(b.cpu_us);
    rw.push_back(r.wall_us), rc.push_back(r.cpu_us);
    dw.push_back(d.wall_us), dc.push_back(d.cpu_us);
  }
  if (lead) {
    const double b = median(bw), r = median(rw), d = median(dw);
    const double cb = median(bc), cr = median(rc), cd = median(dc);
    std::printf("all_reduce of 4 floats, %d ranks, median of %d interleaved rounds (rank 0)\n",
                bare->size(), rounds);
    std::printf("| group | wall us/call | vs bare | CPU us/call | vs bare |\n"
                "|---|---:|---:|---:|---:|\n");
    std::printf("| bare (no recorder, no debug) | %.1f | 1.00 | %.1f | 1.00 |\n", b, cb);
    std::printf("| flight recorder (default) | %.1f | %.2f | %.1f | %.2f |\n", r, r / b, cr,
                cr / cb);
    std::printf("| DDP_DEBUG=detail | %.1f | %.1f | %.1f | %.1f |\n", d, d / b, cd, cd / cb);
  }
  recorder->barrier();
  return 0;
}
