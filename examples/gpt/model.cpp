#include "model.h"

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>
#include <torch/version.h>

#include <cmath>

namespace gpt {

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& config)
    : n_head(config.n_head), dropout(config.dropout) {
  // No bias on q, k, v (Note [No bias on qkv] in model.h).
  const auto projection = torch::nn::LinearOptions(config.n_embd, config.n_embd).bias(false);
  q = register_module("q", ddp::TensorParallel<torch::nn::LinearImpl>(projection));
  k = register_module("k", ddp::TensorParallel<torch::nn::LinearImpl>(projection));
  v = register_module("v", ddp::TensorParallel<torch::nn::LinearImpl>(projection));
  proj = register_module("proj",
                         ddp::TensorParallel<torch::nn::LinearImpl>(config.n_embd, config.n_embd));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), hd = x.size(2) / n_head;
  // Under tensor parallelism q, k and v are this rank's heads (Note [Tensor-parallel GPT]).
  const at::Tensor q_out = this->q(x);
  const int64_t c = q_out.size(2), h = c / hd;
  auto heads = [&](const at::Tensor& y) { return y.view({b, t, h, hd}).transpose(1, 2); };
  const at::Tensor q = heads(q_out), k = heads(this->k(x)), v = heads(this->v(x));  // [B,h,T,hd]
  const double p = is_training() ? dropout : 0.0;
#if TORCH_VERSION_MAJOR >= 2
  at::Tensor y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, p, /*is_causal=*/true);
#else
  // LibTorch 1.13 has no scaled_dot_product_attention: its math path, written out.
  at::Tensor att = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(hd)));
  const at::Tensor future = at::ones({t, t}, x.options().dtype(at::kBool)).triu(1);
  att = at::softmax(att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
  att = at::dropout(att, p, is_training());
  at::Tensor y = at::matmul(att, v);
#endif
  y = y.transpose(1, 2).contiguous().view({b, t, c});
  return at::dropout(proj(y), dropout, is_training());
}

MlpImpl::MlpImpl(const GptConfig& config) : dropout(config.dropout) {
  fc = register_module("fc", ddp::TensorParallel<torch::nn::LinearImpl>(config.n_embd,
                                                                        4 * config.n_embd));
  proj = register_module("proj", ddp::TensorParallel<torch::nn::LinearImpl>(4 * config.n_embd,
                                                                            config.n_embd));
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  return at::dropout(proj(at::gelu(fc(x))), dropout, is_training());
}

BlockImpl::BlockImpl(const GptConfig& config) {
  ln_1 =
      register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  attn = register_module("attn", CausalSelfAttention(config));
  ln_2 =
      register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  mlp = register_module("mlp", Mlp(config));
}

at::Tensor BlockImpl::forward(at::Tensor x) {
  x = x + attn(ln_1(x));
  return x + mlp(ln_2(x));
}

GptImpl::GptImpl(const GptConfig& config_) : config(config_) {
  TORCH_CHECK(config.vocab_size > 0, "GPT: vocab_size must be positive, got ", config.vocab_size);
  TORCH_CHECK(config.n_embd % config.n_head == 0, "GPT: n_embd (", config.n_embd,
              ") must be a multiple of n_head (", config.n_head, ")");
  wte = register_module("wte", torch::nn::Embedding(config.vocab_size, config.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(config.block_size, config.n_embd));
  blocks = register_module("blocks", torch::nn::Sequential());
  for (int64_t i = 0; i < config.n_layer; ++i) blocks->push_back(Block(config));
  ln_f =
      register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));

  at::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * double(config.n_layer));
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    at::Tensor& p = item.value();
    if (p.dim() == 1) {
      // LayerNorm weights stay 1; every bias, LayerNorm's included, starts at 0.
      if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) p.zero_();
    } else {
      const bool residual = name.find("attn.proj.weight") != std::string::npos ||
                            name.find("mlp.proj.weight") != std::string::npos;
      p.normal_(0.0, residual ? residual_std : 0.02);
    }
  }
}

at::Tensor GptImpl::forward(const at::Tensor& idx) {
  const int64_t t = idx.size(1);
  TORCH_CHECK(t <= config.block_size, "GPT: a sequence of ", t,
              " tokens is longer than the block size ", config.block_size);
  const at::Tensor pos = at::arange(t, idx.options().dtype(at::kLong));
  at::Tensor x = at::dropout(wte(idx) + wpe(pos), config.dropout, is_training());
  x = ln_f(blocks->forward(x));
  return torch::nn::functional::linear(x, wte->weight);
}

GptStageImpl::GptStageImpl(const GptImpl& model, int stage, int stages)
    : config(model.config), first(stage == 0), last(stage == stages - 1) {
  if (first || last) wte = register_module("wte", model.wte);
  if (first) wpe = register_module("wpe", model.wpe);
  blocks = register_module("blocks", ddp::pipeline_slice(model.blocks, stage, stages));
  if (last) ln_f = register_module("ln_f", model.ln_f);
}

at::Tensor GptStageImpl::forward(const at::Tensor& input) {
  at::Tensor x = input;
  if (first) {
    const int64_t t = x.size(1);
    TORCH_CHECK(t <= config.block_size, "GPT: a sequence of ", t,
                " tokens is longer than the block size ", config.block_size);
    const at::Tensor pos = at::arange(t, x.options().dtype(at::kLong));
    x = at::dropout(wte(x) + wpe(pos), config.dropout, is_training());
  }
  x = blocks->forward(x);
  if (!last) return x;
  return torch::nn::functional::linear(ln_f(x), wte->weight);
}

bool GptImpl::decays(const std::string& name, const at::Tensor& parameter) {
  return parameter.dim() == 2 && name.rfind("wte.", 0) != 0 && name.rfind("wpe.", 0) != 0;
}

std::vector<int64_t> generate(GptImpl& model, std::vector<int64_t> prompt, int64_t length,
                              uint64_t seed) {
  TORCH_CHECK(!prompt.empty(), "generate: the prompt is empty");
  const bool was_training = model.is_training();
  model.eval();
  at::NoGradGuard no_grad;
  const auto device = model.wte->weight.device();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (int64_t i = 0; i < length; ++i) {
    const size_t n = std::min<size_t>(prompt.size(), size_t(model.config.block_size));
    const std::vector<int64_t> context(prompt.end() - n, prompt.end());
    const at::Tensor idx = at::tensor(context, at::kLong).view({1, -1}).to(device);
    const at::Tensor logits = model.forward(idx).select(1, -1).to(at::kFloat).cpu();  // [1, V]
    const at::Tensor probs = at::softmax(logits, -1);
    prompt.push_back(at::multinomial(probs, 1, false, generator).item<int64_t>());
  }
  model.train(was_training);
  return prompt;
}

}  // namespace gpt
