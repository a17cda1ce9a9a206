// All-reduce micro-benchmark, nccl-tests style: for each message size, the median time of
// a float32 SUM all-reduce on Gloo and on the shared-memory backend, side by side, their
// bus bandwidth (bytes / time * 2(n-1)/n, the bytes each rank's link carries in a ring),
// and how the shared-memory one compares with a plain memcpy of the same bytes. The
// shared-memory backend is measured three times: on an ordinary tensor (copied through
// the segment in slices), on a buffer the group made, as DDP's buckets with a comm hook
// or gradient_as_bucket_view are (reduced in place in shared memory, Note [Zero-copy
// buffers]), and on an ordinary tensor reduced where it is, straight between the ranks'
// memory, as DDP's gradients are by default (Note [Direct all-reduce]; scaled by 1/n, as
// DDP scales them).
//
// Run under a launcher:  ddprun --nproc-per-node 2 --no-prefix -- bench_allreduce [MIN [MAX [busy]]]
//
// With "busy", every rank also runs one compute thread (a loop of single-threaded
// matrix products) for the whole measurement, the way backward computes while DDP's
// buckets are in flight: the same all-reduce, but sharing the cores with work.

#include <ddp/distributed/process_group.h>

#include "distributed/comm.h"

#include "bench_args.h"
#include "bench_timing.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

using bench::median;

double time_calls(ddp::ProcessGroup& pg, int iters, const std::function<void()>& call) {
  return bench::time_calls(pg, iters, call, /*warmup=*/3);
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

double time_all_reduce(ddp::ProcessGroup& pg, at::Tensor& t, int iters) {
  return time_calls(pg, iters, [&] { pg.all_reduce(t); });
}

// The direct all-reduce of `t` where it lies (Note [Direct all-reduce]), scaled by 1/n
// as DDP's gradients are; NaN where the group cannot.
double time_in_place(ddp::ProcessGroup& pg, at::Tensor& t, int iters) {
  ddp::detail::Comm& comm = ddp::detail::comm_of(pg);
  auto agree = at::full({1}, comm.reduces_in_place(t.scalar_type(), 1) ? 1.0 : 0.0, at::kDouble);
  pg.all_reduce(agree, ddp::ReduceOp::MIN);
  if (agree.item<double>() == 0) return std::numeric_limits<double>::quiet_NaN();
  std::vector<at::Tensor> tensors{t};
  const double scale = 1.0 / pg.size();
  return time_calls(pg, iters, [&] { comm.all_reduce_in_place(tensors, scale)->wait(); });
}

// Median seconds of a memcpy of `bytes` in this process: the ceiling of any transport
// through memory.
double time_memcpy(int64_t bytes) {
  std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes), 0);
  std::memcpy(dst.data(), src.data(), src.size());
  std::vector<double> times;
  for (int i = 0; i < 9; ++i) {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), src.size());
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return median(times);
}

}  // namespace

constexpr const char* kUsage =
    "usage: ddprun --nproc-per-node N --no-prefix -- bench_allreduce [MIN [MAX [busy]]]\n"
    "  MIN, MAX  message sizes in bytes, a positive multiple of 4 each, MIN <= MAX\n"
    "            (default 4096 and 67108864); sizes double from MIN to MAX\n"
    "  busy      one compute thread per rank for the whole measurement\n";

int main(int argc, char** argv) {
  int64_t min_bytes = 4 << 10, max_bytes = 64 << 20;
  const std::string program = "bench_allreduce";
  bench::handle_help(argc, argv,
                     "All-reduce micro-benchmark: Gloo against shared memory, by message size.",
                     kUsage);
  bench::at_most(program, argc, 3, kUsage);
  if (argc > 1) min_bytes = bench::positive_arg(program, "MIN", argv[1], kUsage, 4);
  if (argc > 2) max_bytes = bench::positive_arg(program, "MAX", argv[2], kUsage, 4);
  if (argc > 3 && std::string(argv[3]) != "busy") {
    bench::usage_error(program,
                       std::string("the third argument must be 'busy', got '") + argv[3] + "'",
                       kUsage);
  }
  if (min_bytes > max_bytes) {
    bench::usage_error(program,
                       "MIN (" + std::to_string(min_bytes) + ") is larger than MAX (" +
                           std::to_string(max_bytes) + ")",
                       kUsage);
  }
  const bool busy = argc > 3;
  at::set_num_threads(1);
  // One group per transport, measured side by side: Gloo through the launcher's
  // rendezvous, shared memory through a FileStore in a directory rank 0 makes.
  ddp::ProcessGroupGuard guard(ddp::InitOptions().backend("gloo"));
  auto gloo = ddp::default_group();
  const int n = gloo->size();
  const int rank = gloo->rank();
  const bool leader = rank == 0;
  std::string dir;
  if (leader) {
    char tmpl[] = "/tmp/ddp-bench-XXXXXX";
    dir = ::mkdtemp(tmpl);
  }
  dir = gloo->all_gather_bytes(dir)[0];
  auto shm = ddp::ProcessGroup::create(ddp::InitOptions()
                                           .backend("shm")
                                           .init_method("file://" + dir + "/store")
                                           .rank(rank)
                                           .world_size(n));
  shm->barrier();
  if (leader) {
    std::printf("# all_reduce (SUM, float32), %d ranks%s; time: median of repeats (slowest rank); "
                "busbw = bytes/time * 2(n-1)/n; memcpy: one process's copy of the same bytes\n",
                n, busy ? ", one compute thread per rank" : "");
    std::printf(
        "| size | gloo (us) | shm (us) | gloo busbw (GB/s) | shm busbw (GB/s) | shm / gloo | "
        "memcpy (GB/s) | shm busbw / memcpy | shm, bucket buffer (us) | bucket busbw (GB/s) | "
        "bucket / gloo | shm, in place (us) | in place busbw (GB/s) | in place / gloo |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
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
    at::Tensor bucket =
        ddp::detail::comm_of(*shm).allocate_buffers({bytes / 4},
                                                    {at::TensorOptions(at::kFloat)})[0];
    bucket.fill_(1);
    // Enough repeats for ~0.5 s per size, at least 5; the two transports alternate in
    // rounds, so that a slow moment of the machine falls on both.
    const int iters = static_cast<int>(std::clamp<int64_t>((64 << 20) / bytes, 5, 200));
    auto direct = at::ones({bytes / 4}, at::kFloat);
    std::vector<double> g, s, z, d;
    for (int round = 0; round < 3; ++round) {
      g.push_back(time_all_reduce(*gloo, t, iters));
      s.push_back(time_all_reduce(*shm, t, iters));
      z.push_back(time_all_reduce(*shm, bucket, iters));
      d.push_back(time_in_place(*shm, direct, iters));
    }
    const double tg = median(g), ts = median(s), tz = median(z), td = median(d);
    const double bus = 2.0 * (n - 1) / n;
    const double gbus = static_cast<double>(bytes) / tg / 1e9 * bus;
    const double sbus = static_cast<double>(bytes) / ts / 1e9 * bus;
    const double zbus = static_cast<double>(bytes) / tz / 1e9 * bus;
    const double dbus = static_cast<double>(bytes) / td / 1e9 * bus;
    const double copy = static_cast<double>(bytes) / time_memcpy(bytes) / 1e9;
    if (leader) {
      std::printf("| %s | %.1f | %.1f | %.3f | %.3f | %.2f | %.2f | %.2f | %.1f | %.3f | %.2f | "
                  "%.1f | %.3f "
                  "| %.2f |\n",
                  human(bytes).c_str(), tg * 1e6, ts * 1e6, gbus, sbus, tg / ts, copy, sbus / copy,
                  tz * 1e6, zbus, tg / tz, td * 1e6, dbus, tg / td);
      std::fflush(stdout);
    }
  }
  stop = true;
  if (compute.joinable()) compute.join();
  shm->barrier();
  shm->shutdown();
  // The store stays until every rank has released its group (the group maps the
  // buckets' pool through it, and a FileStore's destructor still writes to it).
  gloo->barrier();
  if (leader) {
    std::remove((dir + "/store").c_str());
    ::rmdir(dir.c_str());
  }
  return 0;
}
