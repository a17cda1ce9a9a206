// ddp-cpp side of the DDP comparison: one trial of one model, with or without
// ddp::DistributedDataParallel. bench_py.py is the same program with PyTorch's DDP;
// run.py launches both with ddprun and compares them.
//
// Each rank writes <out>/rank<r>.json: per-iteration times of the measured iterations and,
// under DDP, ddp-cpp's IterationStats of each of them (read after the timed region). With
// --with-plain 1 (world size 1) it also times the loop without DDP on the same module, in
// blocks alternating with the DDP loop (see Note [Paired overhead] in bench_py.py).
// With --ddp 0 under several processes, every process trains its own replica with no
// process group and no communication at all: the floor that no transport can beat, since
// the processes still share the cores and the memory.
//
//   ddprun --nproc-per-node 2 -- bench_compare --model small --ddp 1 --out DIR

#include "models.h"

#include <ddp/parallel/comm_hooks.h>
#include <ddp/parallel/distributed_data_parallel.h>
#include <ddp/parallel/powersgd.h>
#include <ddp/distributed/process_group.h>
#include <ddp/parallel/trace.h>

#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Args {
  std::string model;
  bool ddp = true;
  int warmup = 10;
  int iters = 50;
  double bucket_cap_mb = 25;
  bool gradient_as_bucket_view = false;
  double lr = 0.01;
  bool set_to_none = true;
  int check_steps = 0;
  bool with_plain = false;
  int block = 5;
  std::string trace;
  std::string out;
  std::string backend;        // empty: the library's choice (shared memory on one host)
  std::string hook = "none";  // none, fp16, bf16, powersgd<r> (start_powerSGD_iter 2)
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

constexpr const char* kUsage =
    "usage: bench_compare --model small|cnn|wide|tiny|gpt --out DIR [--ddp 1] [--warmup 10]\n"
    "       [--iters 50] [--bucket-cap-mb 25] [--gradient-as-bucket-view 0]\n"
    "       [--lr 0.01] [--set-to-none 1]\n"
    "       [--check-steps K] [--with-plain 0] [--block 5] [--trace PATH]\n"
    "       [--backend gloo|shm]  (default: the library's choice)\n"
    "       [--hook none|fp16|bf16|powersgd<rank>]  (PowerSGD from iteration 2)\n";

[[noreturn]] void usage(const std::string& problem) {
  if (env_int("RANK", 0) == 0) std::cerr << "bench_compare: " << problem << "\n" << kUsage;
  std::exit(2);
}

[[noreturn]] void help() {
  if (env_int("RANK", 0) == 0) {
    std::cout << "One trial of the DDP comparison (bench/run-compare runs it under ddprun).\n"
              << kUsage;
  }
  std::exit(0);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") help();
    if (i + 1 >= argc) usage("missing value after " + flag);
    const std::string v = argv[++i];
    if (flag == "--model")
      a.model = v;
    else if (flag == "--ddp")
      a.ddp = std::stoi(v) != 0;
    else if (flag == "--warmup")
      a.warmup = std::stoi(v);
    else if (flag == "--iters")
      a.iters = std::stoi(v);
    else if (flag == "--bucket-cap-mb")
      a.bucket_cap_mb = std::stod(v);
    else if (flag == "--gradient-as-bucket-view")
      a.gradient_as_bucket_view = std::stoi(v) != 0;
    else if (flag == "--lr")
      a.lr = std::stod(v);
    else if (flag == "--set-to-none")
      a.set_to_none = std::stoi(v) != 0;
    else if (flag == "--check-steps")
      a.check_steps = std::stoi(v);
    else if (flag == "--with-plain")
      a.with_plain = std::stoi(v) != 0;
    else if (flag == "--block")
      a.block = std::stoi(v);
    else if (flag == "--trace")
      a.trace = v;
    else if (flag == "--out")
      a.out = v;
    else if (flag == "--backend")
      a.backend = v;
    else if (flag == "--hook")
      a.hook = v;
    else
      usage("unknown flag " + flag);
  }
  if (a.model.empty() || a.out.empty()) usage("--model and --out are required");
  try {
    bench::spec(a.model);
  } catch (const c10::Error& e) {
    usage(e.msg());
  }
  if (a.iters < 1) usage("--iters must be >= 1");
  if (a.block < 1) usage("--block must be >= 1");
  if (a.hook != "none" && a.hook != "fp16" && a.hook != "bf16" &&
      !(a.hook.rfind("powersgd", 0) == 0 && a.hook.size() > 8 &&
        a.hook.find_first_not_of("0123456789", 8) == std::string::npos))
    usage("--hook must be none, fp16, bf16 or powersgd<rank> (e.g. powersgd4), got " + a.hook);
  return a;
}

std::string json_list(const std::vector<double>& v) {
  std::ostringstream s;
  s.precision(9);
  s << "[";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  return s.str() + "]";
}

std::string json_list(const std::vector<int64_t>& v) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  return s.str() + "]";
}

std::string stats_json(const ddp::IterationStats& s) {
  std::ostringstream o;
  o.precision(9);
  o << "{\"iteration\":" << s.iteration << ",\"num_buckets\":" << s.num_buckets
    << ",\"launched_before_end\":" << s.buckets_launched_before_end
    << ",\"done_before_end\":" << s.buckets_done_before_end << ",\"backward_ms\":" << s.backward_ms
    << ",\"wait_ms\":" << s.wait_ms << ",\"allreduce_total_ms\":" << s.allreduce_total_ms
    << ",\"bucket_bytes\":" << json_list(s.bucket_bytes) << ",\"bytes_sent\":" << s.bytes_sent
    << ",\"bucket_ms\":" << json_list(s.bucket_allreduce_ms) << "}";
  return o.str();
}

void dump_parameters(torch::nn::Module& model, const std::string& path) {
  std::vector<at::Tensor> flat;
  for (const auto& p : model.parameters()) flat.push_back(p.detach().reshape({-1}));
  auto all = at::cat(flat).contiguous();
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(all.data_ptr()), all.numel() * sizeof(float));
  TORCH_CHECK(f.good(), "cannot write ", path);
}

// optimizer.zero_grad(set_to_none) spelled out: its default differs between LibTorch
// 1.13 (zero) and 2.x (none); Python passes the same value explicitly.
void zero_grad(std::vector<at::Tensor>& params, bool set_to_none) {
  for (auto& p : params) {
    if (set_to_none) {
      p.mutable_grad() = at::Tensor();
    } else if (p.grad().defined()) {
      p.mutable_grad().detach_();
      p.mutable_grad().zero_();
    }
  }
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int64_t num_parameters(torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

// One training loop: forward (through DDP or not), cross-entropy, backward, SGD. The
// DDP loop and the plain one run the very same code.
struct Loop {
  Loop(torch::nn::Sequential m, double lr)
      : model(std::move(m)),
        params(model->parameters()),
        optimizer(params, torch::optim::SGDOptions(lr)),
        forward([this](const at::Tensor& x) { return model->forward(x); }) {}

  void step(const at::Tensor& x, const at::Tensor& y, bool set_to_none) {
    zero_grad(params, set_to_none);
    auto loss = torch::nn::functional::cross_entropy(forward(x), y);
    loss.backward();
    if (traced != nullptr) {
      ddp::trace::Scope scope(*traced, "optimizer.step");
      optimizer.step();
    } else {
      optimizer.step();
    }
  }

  torch::nn::Sequential model;
  std::vector<at::Tensor> params;
  torch::optim::SGD optimizer;
  std::function<at::Tensor(const at::Tensor&)> forward;
  const ddp::DistributedDataParallelBase* traced = nullptr;  // marks optimizer.step
};

int run(const Args& args) {
  at::set_num_threads(1);
  const int rank = env_int("RANK", 0);
  const int world = env_int("WORLD_SIZE", 1);
  std::unique_ptr<ddp::ProcessGroupGuard> group;
  if (args.ddp) {
    group = std::make_unique<ddp::ProcessGroupGuard>(ddp::InitOptions().backend(args.backend));
  }

  auto model = bench::build(args.model);
  using DDP = ddp::DistributedDataParallel<torch::nn::Sequential>;
  DDP dmodel(nullptr);
  auto options = ddp::DistributedDataParallelOptions()
                     .bucket_cap_mb(args.bucket_cap_mb)
                     .gradient_as_bucket_view(args.gradient_as_bucket_view);
  if (!args.trace.empty()) options.trace_path(args.trace);
  if (args.ddp) dmodel = DDP(model, options);
  if (args.ddp && args.hook != "none") {
    TORCH_CHECK(!args.with_plain, "--hook needs --with-plain 0");
    if (args.hook == "fp16") {
      dmodel->register_comm_hook(ddp::comm_hooks::fp16_compress_hook());
    } else if (args.hook == "bf16") {
      dmodel->register_comm_hook(ddp::comm_hooks::bf16_compress_hook());
    } else {
      dmodel->register_comm_hook(ddp::powersgd_hook(std::make_shared<ddp::PowerSGDState>(
          ddp::PowerSGDState()
              .matrix_approximation_rank(std::stoll(args.hook.substr(8)))
              .start_powerSGD_iter(2))));
    }
  }
  std::filesystem::create_directories(args.out);
  auto data = bench::batches(args.model, rank);

  Loop main_loop(model, args.lr);
  if (args.ddp) {
    main_loop.forward = [&dmodel](const at::Tensor& x) { return dmodel->forward(x); };
    if (!args.trace.empty()) main_loop.traced = dmodel.ptr().get();
  }
  // --with-plain: the same loop without DDP, on the same module (its own forward, not
  // the wrapper's), so that both loops use the very same tensors. See Note [Paired
  // overhead] in bench_py.py. DDP's gradient hooks refuse a backward that bypassed the
  // wrapper, also at world size 1, so the module is unwrapped for plain blocks and
  // wrapped again for DDP blocks, outside the timed iterations.
  std::unique_ptr<Loop> plain_loop;
  if (args.with_plain) {
    TORCH_CHECK(args.ddp && world == 1, "--with-plain 1 needs --ddp 1 and world size 1");
    plain_loop = std::make_unique<Loop>(model, args.lr);
  }
  auto wrapped = [&](bool wrap) {
    if (!args.with_plain || wrap == !dmodel.is_empty()) return;
    dmodel = wrap ? DDP(model, options) : DDP(nullptr);
  };
  auto step = [&](Loop& loop, int i) {
    const auto& batch = data[i % data.size()];
    loop.step(batch.first, batch.second, args.set_to_none);
  };

  if (args.check_steps > 0) {
    for (int i = 0; i < args.check_steps; ++i) step(main_loop, i);
    dump_parameters(*model, args.out + "/rank" + std::to_string(rank) + ".bin");
    return 0;
  }

  for (int i = 0; i < args.warmup; ++i) {
    wrapped(true);
    step(main_loop, i);
    if (!plain_loop) continue;
    wrapped(false);
    step(*plain_loop, i);
  }
  if (args.ddp) ddp::barrier();

  // Timed iterations; with --with-plain in alternating blocks (ABBA...) of the two loops,
  // so that both see the same process and the same moment of the machine.
  std::vector<double> times, plain_times;
  std::vector<ddp::IterationStats> stats;
  times.reserve(args.iters);
  plain_times.reserve(args.iters);
  stats.reserve(args.iters);
  double cpu_s = 0, plain_cpu_s = 0;  // every thread of the process, Gloo's included
  auto run_block = [&](bool is_plain) {
    auto& t = is_plain ? plain_times : times;
    wrapped(!is_plain);
    const double cpu_start = process_cpu_seconds();
    for (int k = 0; k < args.block && static_cast<int>(t.size()) < args.iters; ++k) {
      const int i = args.warmup + static_cast<int>(t.size());
      const auto start = std::chrono::steady_clock::now();
      step(is_plain ? *plain_loop : main_loop, i);
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      if (args.ddp && !is_plain) stats.push_back(dmodel->last_iteration_stats());
    }
    (is_plain ? plain_cpu_s : cpu_s) += process_cpu_seconds() - cpu_start;
  };
  for (int b = 0; static_cast<int>(times.size()) < args.iters ||
                  (args.with_plain && static_cast<int>(plain_times.size()) < args.iters);
       ++b) {
    const bool plain_first = args.with_plain && b % 2 == 1;
    run_block(plain_first);
    if (args.with_plain) run_block(!plain_first);
  }

  std::ostringstream o;
  o << "{\"side\":\"cpp\",\"model\":\"" << args.model << "\",\"ddp\":" << (args.ddp ? 1 : 0)
    << ",\"rank\":" << rank << ",\"world_size\":" << world
    << ",\"batch\":" << bench::spec(args.model).batch
    << ",\"num_parameters\":" << num_parameters(*model) << ",\"iter_s\":" << json_list(times)
    << ",\"cpu_s\":" << cpu_s << ",\"torch\":\"" << TORCH_VERSION << "\""
    << ",\"backend\":\"" << (args.ddp ? ddp::default_group()->backend() : std::string("none"))
    << "\"";
  if (args.with_plain) {
    o << ",\"plain_iter_s\":" << json_list(plain_times) << ",\"plain_cpu_s\":" << plain_cpu_s;
  }
  o << ",\"stats\":";
  if (args.ddp && world > 1) {
    o << "{\"iterations\":[";
    for (size_t i = 0; i < stats.size(); ++i) o << (i ? "," : "") << stats_json(stats[i]);
    o << "]}";
  } else {
    o << "null";
  }
  o << "}\n";
  const std::string path = args.out + "/rank" + std::to_string(rank) + ".json";
  std::ofstream f(path);
  f << o.str();
  TORCH_CHECK(f.good(), "cannot write ", path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::cerr << "bench_compare (rank " << env_int("RANK", 0) << "): " << e.what() << "\n";
    return 1;
  }
}
