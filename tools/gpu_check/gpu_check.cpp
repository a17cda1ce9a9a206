// The GPU checks of scripts/gpu-check, as one program run under ddprun.
//
//   --check ws1     one rank: DDP must give the same gradients as plain training, and
//                   its per-iteration overhead is measured (median of repeats).
//   --check ranks   N ranks: each rank's DDP gradient must equal the gradient of the
//                   whole concatenated batch computed by one process.
//
// --device cpu|cuda and --backend gloo|nccl choose the path, so the same checks also run
// on CPU machines (where scripts/test builds this program).

#include <ddp/ddp.h>

#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(256, 512));
    fc2 = register_module("fc2", torch::nn::Linear(512, 512));
    fc3 = register_module("fc3", torch::nn::Linear(512, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Net);

// Deterministic weights, independent of the RNG, identical on every rank.
void fill_weights(Net& net) {
  torch::NoGradGuard no_grad;
  int64_t k = 0;
  for (auto& p : net->parameters()) {
    auto v = torch::arange(p.numel(), torch::kFloat).add_(static_cast<double>(++k));
    p.copy_(torch::sin(v).mul_(0.05).view_as(p));
  }
}

// Batch `index` of the synthetic data: a closed form, so any rank can build any batch.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t index, int64_t size) {
  auto base = torch::arange(index * size * 256, (index + 1) * size * 256, torch::kFloat);
  auto x = torch::cos(base * 0.37).view({size, 256});
  auto y = torch::arange(index * size, (index + 1) * size, torch::kLong).remainder(10);
  return {x, y};
}

double max_rel_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    auto diff = (a[i].cpu() - b[i].cpu()).abs().max().item<double>();
    auto scale = std::max(b[i].cpu().abs().max().item<double>(), 1e-12);
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

std::vector<torch::Tensor> grads(Net& net) {
  std::vector<torch::Tensor> g;
  for (auto& p : net->parameters()) g.push_back(p.grad().detach().clone());
  return g;
}

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddp-cpp GPU checks (run under ddprun)"};
  std::string check = "ws1", device_name = "cuda", backend = "nccl";
  int64_t batch_size = 64;
  int iters = 200;
  app.add_option("--check", check, "ws1 or ranks")->capture_default_str();
  app.add_option("--device", device_name, "cuda or cpu")->capture_default_str();
  app.add_option("--backend", backend, "nccl or gloo")->capture_default_str();
  app.add_option("--batch-size", batch_size, "per rank")->capture_default_str();
  app.add_option("--iters", iters, "timed iterations (ws1)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  ddp::ProcessGroupGuard guard(ddp::InitOptions().backend(backend));
  const int rank = ddp::get_rank(), world = ddp::get_world_size();
  const torch::Device device = device_name == "cuda"
                                   ? torch::Device(torch::kCUDA, ddp::get_local_rank())
                                   : torch::Device(torch::kCPU);
  if (device.is_cuda()) {
    TORCH_CHECK(torch::cuda::is_available(), "--device cuda, but no CUDA device is visible");
  }

  Net plain, wrapped_inner;
  fill_weights(plain);
  fill_weights(wrapped_inner);
  plain->to(device);
  wrapped_inner->to(device);
  ddp::DistributedDataParallelOptions opts;
  if (device.is_cuda()) opts.device_ids({device.index()});
  auto dmodel = ddp::DistributedDataParallel(wrapped_inner, opts);

  if (check == "ws1") {
    auto [x, y] = batch(0, batch_size);
    x = x.to(device);
    y = y.to(device);
    torch::nn::functional::cross_entropy(plain(x), y).backward();
    torch::nn::functional::cross_entropy(dmodel(x), y).backward();
    const double diff = max_rel_diff(grads(wrapped_inner), grads(plain));

    // Interleaved timing of the same step with and without DDP.
    std::vector<double> t_plain, t_ddp;
    auto step = [&](auto&& model, Net& inner) {
      for (auto& p : inner->parameters()) p.mutable_grad() = torch::Tensor();
      sync(device);
      const auto start = std::chrono::steady_clock::now();
      torch::nn::functional::cross_entropy(model(x), y).backward();
      sync(device);
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
          .count();
    };
    for (int i = 0; i < 20; ++i) {
      step(plain, plain);
      step(dmodel, wrapped_inner);
    }
    for (int i = 0; i < iters; ++i) {
      t_plain.push_back(step(plain, plain));
      t_ddp.push_back(step(dmodel, wrapped_inner));
    }
    const double mp = median(t_plain), md = median(t_ddp);
    std::printf("ws1 %s/%s: max relative gradient difference %.3g (%s); step plain %.1f us, "
                "DDP %.1f us, overhead %+.2f%%\n",
                backend.c_str(), device_name.c_str(), diff, diff <= 1e-6 ? "equal" : "DIFFERENT",
                mp, md, 100.0 * (md - mp) / mp);
    return diff <= 1e-6 ? 0 : 1;
  }

  TORCH_CHECK(check == "ranks", "--check must be ws1 or ranks, but got ", check);
  // Rank r trains on batch r; the reference is one process on the concatenation.
  auto [x, y] = batch(rank, batch_size);
  torch::nn::functional::cross_entropy(dmodel(x.to(device)), y.to(device)).backward();
  std::vector<torch::Tensor> xs, ys;
  for (int r = 0; r < world; ++r) {
    auto b = batch(r, batch_size);
    xs.push_back(b.first);
    ys.push_back(b.second);
  }
  torch::nn::functional::cross_entropy(plain(torch::cat(xs).to(device)), torch::cat(ys).to(device))
      .backward();
  const double diff = max_rel_diff(grads(wrapped_inner), grads(plain));
  auto worst = torch::full({1}, diff, torch::kDouble);
  ddp::all_reduce(worst, ddp::ReduceOp::MAX);
  if (rank == 0) {
    std::printf("%d ranks %s/%s: max relative gradient difference vs one process %.3g (%s)\n",
                world, backend.c_str(), device_name.c_str(), worst.item<double>(),
                worst.item<double>() <= 1e-5 ? "equal" : "DIFFERENT");
  }
  return worst.item<double>() <= 1e-5 ? 0 : 1;
}
