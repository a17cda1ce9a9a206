// Every collective at one message size (16 MB by default), nccl-tests style: the median
// time of each op on Gloo and on the shared-memory backend, side by side in one run, their
// bus bandwidth and the ratio. busbw = S / time * factor, with S and the factor of
// nccl-tests' PERFORMANCE.md: the all-reduce's S is the tensor and its factor 2(n-1)/n;
// all_gather's and reduce_scatter's S is the whole (n parts) and the factor (n-1)/n, as
// for gather, scatter and all_to_all; broadcast's and reduce's factor is 1; a ring of
// send/recv moves S per rank with factor 1. The last column says whether the shm backend
// runs the op in shared memory or hands it to the Gloo group it owns
// (docs/process_groups.md, "Where each runs").
//
// Run under a launcher:  ddprun --nproc-per-node N --no-prefix -- bench_collectives [BYTES]

#include <ddp/distributed/process_group.h>

#include "bench_args.h"
#include "bench_timing.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using bench::median;

double time_calls(ddp::ProcessGroup& pg, int iters, const std::function<void()>& call) {
  return bench::time_calls(pg, iters, call, /*warmup=*/2);
}

struct Op {
  const char* name;
  double factor;         // busbw = bytes / time * factor
  const char* shm_path;  // how the shm backend runs it
  // Runs the op once on `pg` with messages of `bytes` in all (see the file comment).
  std::function<std::function<void()>(ddp::ProcessGroup& pg, int64_t bytes)> make;
};

std::vector<Op> ops(int n) {
  const double ring = static_cast<double>(n - 1) / n;
  auto floats = [](int64_t bytes) { return at::ones({bytes / 4}, at::kFloat); };
  auto parts = [](int64_t bytes, int count) {
    std::vector<at::Tensor> v;
    for (int i = 0; i < count; ++i) v.push_back(at::ones({bytes / 4 / count}, at::kFloat));
    return v;
  };
  std::vector<Op> out;
  out.push_back({"all_reduce", 2 * ring, "shared memory", [=](ddp::ProcessGroup& pg, int64_t b) {
                   auto t = floats(b);
                   return std::function<void()>([&pg, t]() mutable { pg.all_reduce(t); });
                 }});
  out.push_back({"broadcast", 1.0, "shared memory", [=](ddp::ProcessGroup& pg, int64_t b) {
                   auto t = floats(b);
                   return std::function<void()>([&pg, t]() mutable { pg.broadcast(t, 0); });
                 }});
  out.push_back({"reduce", 1.0, "shared memory", [=](ddp::ProcessGroup& pg, int64_t b) {
                   auto t = floats(b);
                   return std::function<void()>([&pg, t]() mutable { pg.reduce(t, 0); });
                 }});
  out.push_back({"all_gather (list)", ring, "shared memory", [=](ddp::ProcessGroup& pg, int64_t b) {
                   auto list = parts(b, pg.size());
                   auto in = list[0].clone();
                   return std::function<void()>(
                       [&pg, list, in]() mutable { pg.all_gather(list, in); });
                 }});
  out.push_back(
      {"all_gather_into_tensor", ring, "shared memory", [=](ddp::ProcessGroup& pg, int64_t b) {
         auto whole = floats(b);
         auto in = at::ones({b / 4 / pg.size()}, at::kFloat);
         return std::function<void()>(
             [&pg, whole, in]() mutable { pg.all_gather_into_tensor(whole, in); });
       }});
  out.push_back(
      {"reduce_scatter (list)", ring, "shared memory", [=](ddp::ProcessGroup& pg, int64_t b) {
         auto list = parts(b, pg.size());
         auto o = list[0].clone();
         return std::function<void()>([&pg, list, o]() mutable { pg.reduce_scatter(o, list); });
       }});
  out.push_back(
      {"reduce_scatter_tensor", ring, "shared memory", [=](ddp::ProcessGroup& pg, int64_t b) {
         auto whole = floats(b);
         auto o = at::ones({b / 4 / pg.size()}, at::kFloat);
         return std::function<void()>(
             [&pg, whole, o]() mutable { pg.reduce_scatter_tensor(o, whole); });
       }});
  out.push_back({"gather", ring, "shared memory", [=](ddp::ProcessGroup& pg, int64_t b) {
                   auto list = pg.rank() == 0 ? parts(b, pg.size()) : std::vector<at::Tensor>();
                   auto in = at::ones({b / 4 / pg.size()}, at::kFloat);
                   return std::function<void()>(
                       [&pg, list, in]() mutable { pg.gather(in, list, 0); });
                 }});
  out.push_back({"scatter", ring, "its Gloo group", [=](ddp::ProcessGroup& pg, int64_t b) {
                   auto list = pg.rank() == 0 ? parts(b, pg.size()) : std::vector<at::Tensor>();
                   auto o = at::ones({b / 4 / pg.size()}, at::kFloat);
                   return std::function<void()>(
                       [&pg, list, o]() mutable { pg.scatter(o, list, 0); });
                 }});
  out.push_back(
      {"all_to_all_single", ring, "its Gloo group", [=](ddp::ProcessGroup& pg, int64_t b) {
         auto in = floats(b);
         auto o = floats(b);
         return std::function<void()>([&pg, in, o]() mutable { pg.all_to_all_single(o, in); });
       }});
  out.push_back({"send/recv ring (batch_isend_irecv)", 1.0, "its Gloo group",
                 [=](ddp::ProcessGroup& pg, int64_t b) {
                   auto in = floats(b);
                   auto o = floats(b);
                   const int r = pg.rank(), w = pg.size();
                   std::vector<ddp::P2POp> p2p{ddp::P2POp(ddp::P2POp::ISEND, o, (r + 1) % w),
                                               ddp::P2POp(ddp::P2POp::IRECV, in, (r + w - 1) % w)};
                   return std::function<void()>([&pg, p2p] {
                     for (auto& work : pg.batch_isend_irecv(p2p)) work.wait();
                   });
                 }});
  return out;
}

}  // namespace

constexpr const char* kUsage =
    "usage: ddprun --nproc-per-node N --no-prefix -- bench_collectives [BYTES]\n"
    "  BYTES  the message size S of every op (default 16777216), a positive multiple of\n"
    "         4 * N * N\n";

int main(int argc, char** argv) {
  const std::string program = "bench_collectives";
  bench::handle_help(argc, argv, "Every collective at one size: Gloo against shared memory, busbw.",
                     kUsage);
  bench::at_most(program, argc, 1, kUsage);
  int64_t bytes = 16 << 20;
  at::set_num_threads(1);
  // Gloo through the launcher's rendezvous; shared memory through a FileStore in a
  // directory rank 0 makes.
  ddp::ProcessGroupGuard guard(ddp::InitOptions().backend("gloo"));
  auto gloo = ddp::default_group();
  const int n = gloo->size();
  const int rank = gloo->rank();
  if (argc > 1) bytes = bench::positive_arg(program, "BYTES", argv[1], kUsage, 4 * n * n);
  if (bytes % (4 * n * n) != 0) {
    bench::usage_error(program,
                       "the default size is not a multiple of 4 * N * N at " + std::to_string(n) +
                           " ranks; pass BYTES",
                       kUsage);
  }
  std::string dir;
  if (rank == 0) {
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
  if (rank == 0) {
    std::printf("# every collective at S = %lld bytes (float32), %d ranks; time: median of 3 "
                "rounds of medians (slowest rank); busbw = S / time * factor\n",
                static_cast<long long>(bytes), n);
    std::printf("| op | factor | gloo (ms) | shm (ms) | gloo busbw (GB/s) | shm busbw (GB/s) | "
                "shm / gloo | shm runs it in |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---|\n");
  }
  const int iters = 7;
  for (const Op& op : ops(n)) {
    auto on_gloo = op.make(*gloo, bytes);
    auto on_shm = op.make(*shm, bytes);
    std::vector<double> g, s;
    // The two transports alternate in rounds, so that a slow moment falls on both.
    for (int round = 0; round < 3; ++round) {
      g.push_back(time_calls(*gloo, iters, on_gloo));
      s.push_back(time_calls(*shm, iters, on_shm));
    }
    const double tg = median(g), ts = median(s);
    const double gbus = static_cast<double>(bytes) / tg / 1e9 * op.factor;
    const double sbus = static_cast<double>(bytes) / ts / 1e9 * op.factor;
    if (rank == 0) {
      std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n", op.name, op.factor,
                  tg * 1e3, ts * 1e3, gbus, sbus, tg / ts, op.shm_path);
      std::fflush(stdout);
    }
  }
  shm->barrier();
  shm->shutdown();
  gloo->barrier();
  if (rank == 0) {
    std::remove((dir + "/store").c_str());
    ::rmdir(dir.c_str());
  }
  return 0;
}
