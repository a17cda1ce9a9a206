// The checks of scripts/gpu-check, as one program run under ddprun. Each case trains a
// wrapped model and the same model without ddp-cpp, from the same weights on the same
// device, and compares them; it prints one line ("case <name>: ok ..." or "FAILED ...")
// and the program exits 1 if any case failed.
//
//   --suite single   one rank over a real one-rank group (InitOptions::single_rank_group),
//                    so that DDP's buckets and hooks, SyncBatchNorm, the GradScaler,
//                    ZeRO, barriers and Join all go through the backend; and DDP's
//                    per-step overhead over plain training (median of interleaved steps).
//   --suite ranks    N ranks: gradients against one process on the whole batch, then
//                    fully_shard, SyncBatchNorm and mixed precision with the GradScaler
//                    the same way.
//   --suite stream   one rank, forward and backward on a side CUDA stream.
//
// The device is the group's (cuda:<local rank> under nccl, the stand-in device under
// DDP_DEVICE_STANDIN=1); under gloo with GPUs, cuda:<local rank % GPUs>, so that several
// ranks can share one GPU; else the CPU.

#include <ddp/ddp.h>

#include <torch/torch.h>
#ifdef DDP_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <CLI/CLI.hpp>

#include "cases.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <tuple>
#include <string>
#include <vector>

namespace {

struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool unused_branch = false) {
    fc1 = register_module("fc1", torch::nn::Linear(256, 512));
    fc2 = register_module("fc2", torch::nn::Linear(512, 512));
    fc3 = register_module("fc3", torch::nn::Linear(512, 10));
    if (unused_branch) spare = register_module("spare", torch::nn::Linear(512, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr}, spare{nullptr};
};
TORCH_MODULE(Net);

// A convolution and a batch norm (SyncBatchNorm or BatchNorm2d), then a classifier.
struct ConvNetImpl : torch::nn::Module {
  explicit ConvNetImpl(bool sync) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)));
    if (sync) {
      sbn = register_module("bn", ddp::SyncBatchNorm(8));
    } else {
      bn = register_module("bn", torch::nn::BatchNorm2d(8));
    }
    fc = register_module("fc", torch::nn::Linear(8 * 6 * 6, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = conv(x);
    x = sbn ? sbn(x) : bn(x);
    return fc(torch::relu(x).flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  ddp::SyncBatchNorm sbn{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ConvNet);

// Deterministic weights, independent of the RNG, identical on every rank.
void fill_weights(torch::nn::Module& net) {
  torch::NoGradGuard no_grad;
  int64_t k = 0;
  for (auto& p : net.parameters()) {
    auto v = torch::arange(p.numel(), torch::kFloat).add_(static_cast<double>(++k));
    p.copy_(torch::sin(v).mul_(0.05).view_as(p));
  }
}

// Batch `index`: a closed form, so any rank can build any batch. `images`: [B,3,8,8].
std::pair<torch::Tensor, torch::Tensor> batch(int64_t index, int64_t size, bool images = false) {
  const int64_t features = images ? 3 * 8 * 8 : 256;
  auto base = torch::arange(index * size * features, (index + 1) * size * features, torch::kFloat);
  auto x = torch::cos(base * 0.37).view({size, features});
  if (images) x = x.view({size, 3, 8, 8});
  auto y = torch::arange(index * size, (index + 1) * size, torch::kLong).remainder(10);
  return {x, y};
}

// max |a - b| over every pair, relative to the largest |b| of all of them (a gradient
// that should be zero, such as a bias before a batch norm, is rounding noise on both
// sides). Undefined pairs must match.
double max_rel_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) return 1e30;
    if (!a[i].defined()) continue;
    const auto x = a[i].detach().cpu().to(torch::kDouble),
               y = b[i].detach().cpu().to(torch::kDouble);
    scale = std::max(scale, y.abs().max().item<double>());
    worst = std::max(worst, (x - y).abs().max().item<double>());
  }
  return worst / scale;
}

std::vector<torch::Tensor> grads(torch::nn::Module& net) {
  std::vector<torch::Tensor> g;
  for (auto& p : net.parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : p.grad());
  return g;
}

std::vector<torch::Tensor> params(torch::nn::Module& net) {
  std::vector<torch::Tensor> out;
  for (auto& p : net.parameters()) out.push_back(p.detach().clone());
  return out;
}

// The same weights twice, on `device`: one model to train plainly, one to wrap.
template <typename M, typename... Args>
std::pair<M, M> twins(const torch::Device& device, Args... args) {
  M plain(args...), inner(args...);
  fill_weights(*plain);
  fill_weights(*inner);
  plain->to(device);
  inner->to(device);
  return {plain, inner};
}

// batch(index, size) on `device`.
std::pair<torch::Tensor, torch::Tensor> batch_on(const torch::Device& device, int64_t index,
                                                 int64_t size, bool images = false) {
  auto [x, y] = batch(index, size, images);
  return {x.to(device), y.to(device)};
}

void synchronize(const torch::Device& device) {
#ifdef DDP_WITH_CUDA
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
#else
  (void)device;
#endif
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

using gpu_check::Cases;
using gpu_check::verdict;

// ---- One rank: every DDP feature through the backend --------------------------------

// Trains `steps` SGD steps of DDP (configured by `setup`) and of the plain model side by
// side; returns the largest relative difference of gradients, then of parameters.
double train_against_plain(const torch::Device& device, int steps,
                           const ddp::DistributedDataParallelOptions& options,
                           const std::function<void(ddp::DistributedDataParallel<Net>&)>& setup,
                           bool unused_branch = false) {
  Net plain{nullptr}, inner{nullptr};
  std::tie(plain, inner) = twins<Net>(device, unused_branch);
  auto dmodel = ddp::DistributedDataParallel(inner, options);
  if (setup) setup(dmodel);
  torch::optim::SGD sgd_plain(plain->parameters(), 0.1), sgd_ddp(dmodel->parameters(), 0.1);
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    torch::Tensor x, y;
    std::tie(x, y) = batch_on(device, s, 32);
    sgd_plain.zero_grad();
    sgd_ddp.zero_grad();
    torch::nn::functional::cross_entropy(plain(x), y).backward();
    torch::nn::functional::cross_entropy(dmodel(x), y).backward();
    worst = std::max(worst, max_rel_diff(grads(*inner), grads(*plain)));
    sgd_plain.step();
    sgd_ddp.step();
  }
  return std::max(worst, max_rel_diff(params(*inner), params(*plain)));
}

void single_rank_suite(Cases& cases, const torch::Device& device, int iters) {
  ddp::DistributedDataParallelOptions base;
  if (device.is_cuda()) base.device_ids({device.index()});
  auto small_buckets = base;
  small_buckets.bucket_cap_mb(0.25);  // about 6 buckets for this 1.6 MB model

  cases.run("DDP buckets", [&] {
    return verdict(train_against_plain(device, 3, small_buckets, nullptr), 1e-6,
                   "3 steps (bucket rebuild included) against plain training:");
  });
  // A compressed wire rounds the gradients: float16 keeps 11 bits, bfloat16 8.
  const struct {
    const char* name;
    std::shared_ptr<ddp::CommHook> (*hook)();
    double tolerance;
    const char* what;
  } hooks[] = {
      {"fp16 compress hook", ddp::comm_hooks::fp16_compress_hook, 2e-3,
       "gradients in float16 on the wire:"},
      {"bf16 compress hook", ddp::comm_hooks::bf16_compress_hook, 1.6e-2,
       "gradients in bfloat16 on the wire:"},
  };
  for (const auto& h : hooks) {
    cases.run(h.name, [&] {
      return verdict(train_against_plain(device, 2, small_buckets,
                                         [&](ddp::DistributedDataParallel<Net>& m) {
                                           m->register_comm_hook(h.hook());
                                         }),
                     h.tolerance, h.what);
    });
  }
  cases.run("find_unused_parameters", [&] {
    auto o = small_buckets;
    o.find_unused_parameters(true);
    return verdict(train_against_plain(device, 3, o, nullptr, /*unused_branch=*/true), 1e-6,
                   "an unused layer, 3 steps:");
  });
  cases.run("static_graph", [&] {
    auto o = small_buckets;
    o.static_graph(true);
    return verdict(train_against_plain(device, 3, o, nullptr), 1e-6, "3 steps:");
  });
  cases.run("gradient_as_bucket_view", [&] {
    auto o = small_buckets;
    o.gradient_as_bucket_view(true);
    return verdict(train_against_plain(device, 3, o, nullptr), 1e-6, "3 steps:");
  });

  cases.run("SyncBatchNorm", [&] {
    ConvNet plain(false), inner(true);
    for (ConvNet* net : {&plain, &inner}) {
      fill_weights(**net);
      (*net)->to(device);
    }
    auto dmodel = ddp::DistributedDataParallel(inner, base);
    torch::Tensor x, y;
    std::tie(x, y) = batch_on(device, 0, 16, /*images=*/true);
    torch::nn::functional::cross_entropy(plain(x), y).backward();
    torch::nn::functional::cross_entropy(dmodel(x), y).backward();
    return verdict(max_rel_diff(grads(*inner), grads(*plain)), 1e-5,
                   "gradients against BatchNorm2d:");
  });

  cases.run("GradScaler with DDP", [&] {
    // float16 autocast on a GPU; elsewhere the scaler alone (scaled loss, unscaled step).
    const bool autocast = device.is_cuda();
    Net plain{nullptr}, inner{nullptr};
    std::tie(plain, inner) = twins<Net>(device);
    auto dmodel = ddp::DistributedDataParallel(inner, base);
    torch::optim::SGD sgd_plain(plain->parameters(), 0.1), sgd_ddp(dmodel->parameters(), 0.1);
    ddp::amp::GradScaler scaler_plain, scaler_ddp;
    // Off, bfloat16: LibTorch 1.13's CPU autocast refuses float16 even when disabled.
    const auto amp = ddp::amp::AutocastOptions().enabled(autocast).dtype(
        autocast ? torch::kHalf : torch::kBFloat16);
    for (int s = 0; s < 3; ++s) {
      torch::Tensor x, y;
      std::tie(x, y) = batch_on(device, s, 32);
      for (int which = 0; which < 2; ++which) {
        torch::Tensor logits;
        {
          ddp::amp::AutocastGuard guard(device.type(), amp);
          logits = which == 0 ? plain(x) : dmodel(x);
        }
        auto& scaler = which == 0 ? scaler_plain : scaler_ddp;
        auto& sgd = which == 0 ? sgd_plain : sgd_ddp;
        sgd.zero_grad();
        scaler.scale(torch::nn::functional::cross_entropy(logits.to(torch::kFloat), y)).backward();
        scaler.step(sgd);
        scaler.update();
      }
    }
    return verdict(max_rel_diff(params(*inner), params(*plain)), autocast ? 1e-3 : 1e-6,
                   std::string(autocast ? "float16 autocast, " : "") + "3 scaled steps:");
  });

  cases.run("ZeroRedundancyOptimizer", [&] {
    Net plain{nullptr}, inner{nullptr};
    std::tie(plain, inner) = twins<Net>(device);
    auto dmodel = ddp::DistributedDataParallel(inner, base);
    torch::optim::Adam adam(plain->parameters(), torch::optim::AdamOptions(1e-3));
    ddp::ZeroRedundancyOptimizer zero(dmodel->parameters(), torch::optim::AdamOptions(1e-3));
    for (int s = 0; s < 3; ++s) {
      torch::Tensor x, y;
      std::tie(x, y) = batch_on(device, s, 32);
      adam.zero_grad();
      zero.zero_grad();
      torch::nn::functional::cross_entropy(plain(x), y).backward();
      torch::nn::functional::cross_entropy(dmodel(x), y).backward();
      adam.step();
      zero.step();
    }
    return verdict(max_rel_diff(params(*inner), params(*plain)), 1e-6, "3 Adam steps:");
  });

  cases.run("barrier and monitored_barrier", [&] {
    ddp::barrier();
    ddp::monitored_barrier(std::chrono::seconds(30));
    return std::string("both returned");
  });

  cases.run("Join", [&] {
    Net plain{nullptr}, inner{nullptr};
    std::tie(plain, inner) = twins<Net>(device);
    auto dmodel = ddp::DistributedDataParallel(inner, base);
    double worst = 0;
    dmodel->join([&] {
      for (int s = 0; s < 3; ++s) {
        torch::Tensor x, y;
        std::tie(x, y) = batch_on(device, s, 32);
        for (auto& p : plain->parameters()) p.mutable_grad() = torch::Tensor();
        for (auto& p : inner->parameters()) p.mutable_grad() = torch::Tensor();
        torch::nn::functional::cross_entropy(plain(x), y).backward();
        torch::nn::functional::cross_entropy(dmodel(x), y).backward();
        worst = std::max(worst, max_rel_diff(grads(*inner), grads(*plain)));
      }
    });
    return verdict(worst, 1e-6, "3 steps inside join:");
  });

  cases.run("DDP overhead", [&] {
    Net plain{nullptr}, inner{nullptr};
    std::tie(plain, inner) = twins<Net>(device);
    auto dmodel = ddp::DistributedDataParallel(inner, base);
    torch::Tensor x, y;
    std::tie(x, y) = batch_on(device, 0, 64);
    std::vector<double> t_plain, t_ddp;
    auto step = [&](auto&& model, Net& net) {
      for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
      synchronize(device);
      const auto start = std::chrono::steady_clock::now();
      torch::nn::functional::cross_entropy(model(x), y).backward();
      synchronize(device);
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
          .count();
    };
    for (int i = 0; i < 10; ++i) {
      step(plain, plain);
      step(dmodel, inner);
    }
    for (int i = 0; i < iters; ++i) {
      t_plain.push_back(step(plain, plain));
      t_ddp.push_back(step(dmodel, inner));
    }
    const ddp::IterationStats stats = dmodel->last_iteration_stats();
    const double mp = median(t_plain), md = median(t_ddp);
    char text[240];
    std::snprintf(text, sizeof(text),
                  "step plain %.1f us, DDP %.1f us (%+.1f%%, median of %d); last iteration: "
                  "%zu buckets, all-reduce %.3f ms in all, %zu done before the end of backward",
                  mp, md, 100.0 * (md - mp) / mp, iters, stats.num_buckets,
                  stats.allreduce_total_ms, stats.buckets_done_before_end);
    if (stats.iteration == 0 || stats.num_buckets == 0 ||
        stats.bucket_allreduce_ms.size() != stats.num_buckets) {
      return std::string("FAILED: DDP reduced nothing through the group: ") + text;
    }
    return std::string(text);
  });
}

// ---- N ranks: one process on the whole batch is the reference ------------------------

void ranks_suite(Cases& cases, const torch::Device& device) {
  const int rank = ddp::get_rank(), world = ddp::get_world_size();
  ddp::DistributedDataParallelOptions base;
  if (device.is_cuda()) base.device_ids({device.index()});

  // The largest difference on any rank, known to every rank. The value travels on the
  // group's device: NCCL takes nothing else.
  auto worst_of_all = [&](double mine) {
    auto worst = torch::full({1}, mine, torch::kDouble).to(ddp::get_device());
    ddp::all_reduce(worst, ddp::ReduceOp::MAX);
    return worst.cpu().item<double>();
  };
  auto whole_batch = [&](int64_t per_rank, bool images) {
    std::vector<torch::Tensor> xs, ys;
    for (int r = 0; r < world; ++r) {
      auto b = batch(r, per_rank, images);
      xs.push_back(b.first);
      ys.push_back(b.second);
    }
    return std::make_pair(torch::cat(xs).to(device), torch::cat(ys).to(device));
  };

  cases.run("gradients against one process", [&] {
    Net plain{nullptr}, inner{nullptr};
    std::tie(plain, inner) = twins<Net>(device);
    auto dmodel = ddp::DistributedDataParallel(inner, base);
    auto [x, y] = batch(rank, 32);
    torch::nn::functional::cross_entropy(dmodel(x.to(device)), y.to(device)).backward();
    auto [xa, ya] = whole_batch(32, false);
    torch::nn::functional::cross_entropy(plain(xa), ya).backward();
    return verdict(worst_of_all(max_rel_diff(grads(*inner), grads(*plain))), 1e-5,
                   std::to_string(world) + " ranks:");
  });

  cases.run("SyncBatchNorm", [&] {
    ConvNet plain(false), inner(true);
    for (ConvNet* net : {&plain, &inner}) {
      fill_weights(**net);
      (*net)->to(device);
    }
    auto dmodel = ddp::DistributedDataParallel(inner, base);
    auto [x, y] = batch(rank, 8, /*images=*/true);
    torch::nn::functional::cross_entropy(dmodel(x.to(device)), y.to(device)).backward();
    auto [xa, ya] = whole_batch(8, true);
    torch::nn::functional::cross_entropy(plain(xa), ya).backward();
    return verdict(worst_of_all(max_rel_diff(grads(*inner), grads(*plain))), 1e-5,
                   "gradients against one BatchNorm2d over the whole batch:");
  });

  // Each Linear a unit, the Sequential the root: 3 SGD steps against one process on the
  // whole batch, the full parameters compared on rank 0.
  cases.run("fully_shard", [&] {
    auto make = [&] {
      torch::nn::Sequential net(torch::nn::Linear(256, 512), torch::nn::ReLU(),
                                torch::nn::Linear(512, 300), torch::nn::ReLU(),
                                torch::nn::Linear(300, 10));
      fill_weights(*net);
      net->to(device);
      return net;
    };
    auto plain = make();
    auto inner = make();
    for (size_t i : {0, 2, 4}) ddp::fully_shard(inner->ptr<torch::nn::LinearImpl>(i));
    auto unit = ddp::fully_shard(inner.ptr());
    // SGD: Adam would magnify the rounding of gradients that are nearly zero.
    torch::optim::SGD sgd_plain(plain->parameters(), 0.1);
    torch::optim::SGD sgd_fsdp(unit->parameters(), 0.1);
    for (int s = 0; s < 3; ++s) {
      auto [x, y] = batch(world * s + rank, 32);
      torch::nn::functional::cross_entropy(unit(x.to(device)), y.to(device)).backward();
      std::vector<torch::Tensor> xs, ys;
      for (int r = 0; r < world; ++r) {
        auto b = batch(world * s + r, 32);
        xs.push_back(b.first);
        ys.push_back(b.second);
      }
      torch::nn::functional::cross_entropy(plain->forward(torch::cat(xs).to(device)),
                                           torch::cat(ys).to(device))
          .backward();
      sgd_fsdp.step();
      sgd_plain.step();
      sgd_fsdp.zero_grad();
      sgd_plain.zero_grad();
    }
    const auto state = ddp::full_state_dict(*inner);
    double diff = 0;
    if (rank == 0) {
      for (const auto& item : plain->named_parameters()) {
        const auto a = state.at(item.key()).to(torch::kDouble);
        const auto b = item.value().detach().cpu().to(torch::kDouble);
        diff = std::max(diff, ((a - b).abs().max() / (b.abs().max() + 1e-12)).item<double>());
      }
    }
    return verdict(worst_of_all(diff), 1e-5,
                   std::to_string(world) + " ranks, 3 units, 3 SGD steps against one process:");
  });

  cases.run("mixed precision with the GradScaler", [&] {
    const bool autocast = device.is_cuda();
    Net plain{nullptr}, inner{nullptr};
    std::tie(plain, inner) = twins<Net>(device);
    auto dmodel = ddp::DistributedDataParallel(inner, base);
    // Off, bfloat16: LibTorch 1.13's CPU autocast refuses float16 even when disabled.
    const auto amp = ddp::amp::AutocastOptions().enabled(autocast).dtype(
        autocast ? torch::kHalf : torch::kBFloat16);
    ddp::amp::GradScaler scaler;
    torch::Tensor logits;
    auto [x, y] = batch(rank, 32);
    {
      ddp::amp::AutocastGuard guard(device.type(), amp);
      logits = dmodel(x.to(device));
    }
    scaler.scale(torch::nn::functional::cross_entropy(logits.to(torch::kFloat), y.to(device)))
        .backward();
    torch::optim::SGD sgd(dmodel->parameters(), 0.0);
    scaler.unscale_(sgd);
    auto [xa, ya] = whole_batch(32, false);
    {
      ddp::amp::AutocastGuard guard(device.type(), amp);
      logits = plain(xa);
    }
    torch::nn::functional::cross_entropy(logits.to(torch::kFloat), ya).backward();
    return verdict(worst_of_all(max_rel_diff(grads(*inner), grads(*plain))), autocast ? 5e-3 : 1e-5,
                   std::string(autocast ? "float16 autocast, " : "") +
                       "unscaled gradients against one process:");
  });
}

// ---- A side stream -------------------------------------------------------------------

void stream_suite(Cases& cases, const torch::Device& device) {
#ifdef DDP_WITH_CUDA
  cases.run("backward on a side stream", [&] {
    if (!device.is_cuda()) return std::string("skipped: needs a CUDA device");
    Net plain{nullptr}, inner{nullptr};
    std::tie(plain, inner) = twins<Net>(device);
    ddp::DistributedDataParallelOptions o;
    o.device_ids({device.index()}).bucket_cap_mb(0.25);
    auto dmodel = ddp::DistributedDataParallel(inner, o);
    torch::Tensor x, y;
    std::tie(x, y) = batch_on(device, 0, 64);
    torch::nn::functional::cross_entropy(plain(x), y).backward();
    auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    torch::cuda::synchronize(device.index());  // the inputs exist before the side stream reads them
    {
      c10::cuda::CUDAStreamGuard guard(side);
      torch::nn::functional::cross_entropy(dmodel(x), y).backward();
    }
    // The gradients are final on the side stream; the default stream waits for it.
    torch::cuda::synchronize(device.index());
    return verdict(max_rel_diff(grads(*inner), grads(*plain)), 1e-6,
                   "gradients against plain training on the default stream:");
  });
#else
  (void)device;
  cases.run("backward on a side stream",
            [] { return std::string("skipped: this build has no CUDA"); });
#endif
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddp-cpp GPU checks (run under ddprun; scripts/gpu-check runs them all)"};
  std::string suite = "single", backend;
  int iters = 200, timeout_s = 60;
  app.add_option("--suite", suite, "single, ranks or stream")
      ->capture_default_str()
      ->check(CLI::IsMember({"single", "ranks", "stream"}));
  app.add_option("--backend", backend,
                 "nccl, gloo, or empty for the library's choice (InitOptions::backend's "
                 "rule: nccl where LibTorch has CUDA and a GPU is visible; standin under "
                 "DDP_DEVICE_STANDIN=1)")
      ->check(CLI::IsMember({"", "nccl", "gloo"}));
  app.add_option("--iters", iters, "timed steps of the overhead case")->capture_default_str();
  app.add_option("--timeout", timeout_s, "process-group timeout, seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    ddp::ProcessGroupGuard guard(ddp::InitOptions()
                                     .backend(backend)
                                     .single_rank_group(suite != "ranks")
                                     .timeout(std::chrono::seconds(timeout_s)));
    const int rank = ddp::get_rank();
    torch::Device device = ddp::get_device();
#ifdef DDP_WITH_CUDA
    if (device.is_cpu() && torch::cuda::is_available()) {
      // Gloo on GPUs: ranks share them, so two ranks fit on one GPU.
      device =
          torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(ddp::get_local_rank() %
                                                                    torch::cuda::device_count()));
    }
#endif
    if (rank == 0) {
      std::printf("gpu_check: suite %s, %d rank(s), backend %s, device %s\n", suite.c_str(),
                  ddp::get_world_size(), ddp::default_group()->backend().c_str(),
                  device.str().c_str());
      std::fflush(stdout);
    }
    Cases cases(rank);
    if (suite == "single") {
      single_rank_suite(cases, device, iters);
    } else if (suite == "ranks") {
      ranks_suite(cases, device);
    } else {
      stream_suite(cases, device);
    }
    ddp::destroy_process_group();
    return cases.failed() == 0 ? 0 : 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "gpu_check: error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_check: error: %s\n", e.what());
    return 1;
  }
}
