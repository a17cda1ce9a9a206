#include "models.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include <cmath>
#include <cstring>

#ifdef BENCH_HAVE_GPT
#include "gpt/model.h"

#include <torch/nn/modules/linear.h>
#endif

namespace bench {

namespace nn = torch::nn;

ModelSpec spec(const std::string& name) {
  if (name == "small") return {32, {512}};
  if (name == "cnn") return {16, {3, 32, 32}};
  if (name == "wide") return {8, {1024}};
  if (name == "tiny") return {4, {16}};
  if (name == "gpt") return {32, {kGptBlock}};
  TORCH_CHECK(false, "unknown model '", name, "': expected small, cnn, wide, tiny or gpt");
}

namespace {

nn::Conv2d conv3x3(int64_t in, int64_t out) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1));
}

// Note [Closed-form weights]: parameter p (registration order) with n elements is
// sin(0.37 * arange(n) + p) * scale, scale = 1/sqrt(fan_in) for weights and 0.01 for
// biases, computed in float64 and rounded to float32: the same bits as models.py.
void init_deterministic(nn::Module& model) {
  at::NoGradGuard no_grad;
  int64_t p = 0;
  for (auto& param : model.parameters()) {
    const int64_t n = param.numel();
    const double scale =
        param.dim() > 1 ? 1.0 / std::sqrt(static_cast<double>(n) / param.size(0)) : 0.01;
    auto w = at::arange(n, at::kDouble).mul_(0.37).add_(static_cast<double>(p)).sin_().mul_(scale);
    param.copy_(w.to(at::kFloat).view_as(param));
    ++p;
  }
}

}  // namespace

nn::Sequential build(const std::string& name) {
  nn::Sequential model;
  if (name == "small") {
    model = nn::Sequential(nn::Linear(512, 1024), nn::ReLU(), nn::Linear(1024, 512), nn::ReLU(),
                           nn::Linear(512, kNumClasses));
  } else if (name == "cnn") {
    model =
        nn::Sequential(conv3x3(3, 32), nn::ReLU(), conv3x3(32, 64), nn::ReLU(), nn::MaxPool2d(2),
                       conv3x3(64, 128), nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(),
                       nn::Linear(128 * 8 * 8, 256), nn::ReLU(), nn::Linear(256, kNumClasses));
  } else if (name == "wide") {
    model = nn::Sequential(nn::Linear(1024, 4096), nn::ReLU(), nn::Linear(4096, 4096), nn::ReLU(),
                           nn::Linear(4096, 1024), nn::ReLU(), nn::Linear(1024, kNumClasses));
  } else if (name == "tiny") {
    model = nn::Sequential(nn::Linear(16, kNumClasses));
  } else if (name == "gpt") {
#ifdef BENCH_HAVE_GPT
    // examples/gpt's default model; its logits [B, T, vocab] flattened to [B*T, vocab]
    // for the loop's cross_entropy.
    gpt::GptConfig config;
    config.vocab_size = kGptVocab;
    config.block_size = kGptBlock;
    config.dropout = 0.0;
    model =
        nn::Sequential(gpt::Gpt(config), nn::Flatten(nn::FlattenOptions().start_dim(0).end_dim(1)));
    init_deterministic(*model);
    // LayerNorm gains near 1, not near 0 (closed form + 1), so that the signal and the
    // gradients have a transformer's size.
    at::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      const std::string& k = item.key();
      for (const char* gain : {"ln_1.weight", "ln_2.weight", "ln_f.weight"}) {
        const size_t n = std::strlen(gain);
        if (k.size() >= n && k.compare(k.size() - n, n, gain) == 0) item.value().add_(1.0);
      }
    }
    return model;
#else
    TORCH_CHECK(false, "model 'gpt' needs examples/gpt (built with the examples)");
#endif
  } else {
    spec(name);  // throws
  }
  init_deterministic(*model);
  return model;
}

std::vector<std::pair<at::Tensor, at::Tensor>> batches(const std::string& name, int rank) {
  const ModelSpec s = spec(name);
  int64_t numel = s.batch;
  for (int64_t d : s.input) numel *= d;
  std::vector<int64_t> shape{s.batch};
  shape.insert(shape.end(), s.input.begin(), s.input.end());
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (int k = 0; k < kNumBatches; ++k) {
    const int64_t i = static_cast<int64_t>(rank) * kNumBatches + k;
    if (name == "gpt") {  // tokens, and the targets of every position, flattened
      auto x = (at::arange(numel, at::kLong) * 7 + 3 * i).remainder(kGptVocab);
      auto y = (at::arange(numel, at::kLong) * 5 + 1 + i).remainder(kGptVocab);
      out.emplace_back(x.view(shape), y);
      continue;
    }
    auto x = at::arange(numel, at::kDouble).mul_(0.013).add_(1.7 * static_cast<double>(i)).sin_();
    auto y = (at::arange(s.batch, at::kLong) * 7 + 3 * i).remainder(kNumClasses);
    out.emplace_back(x.to(at::kFloat).view(shape), y);
  }
  return out;
}

}  // namespace bench
