#pragma once

// The models of the fully_shard tests: a small transformer (embedding, two blocks of
// attention and MLP in a Sequential, LayerNorm, output weights tied to the embedding),
// the same as tests/parallel/python/fsdp_peer.py's.

#include <ATen/ATen.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <memory>

namespace ddp_test {

constexpr int64_t kVocab = 11, kCtx = 6, kDim = 12, kHeads = 2;

struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})))),
        // No bias: the key's bias has a zero gradient in exact arithmetic (softmax does not
        // see a shift), so Adam would amplify the rounding noise of its gradient.
        qkv(register_module("qkv", torch::nn::Linear(
                                       torch::nn::LinearOptions(kDim, 3 * kDim).bias(false)))),
        proj(register_module("proj", torch::nn::Linear(kDim, kDim))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})))),
        fc(register_module("fc", torch::nn::Linear(kDim, 4 * kDim))),
        out(register_module("out", torch::nn::Linear(4 * kDim, kDim))) {}
  at::Tensor forward(at::Tensor x) {
    const int64_t b = x.size(0), t = x.size(1), hd = kDim / kHeads;
    auto parts = qkv(ln1(x)).chunk(3, -1);
    auto heads = [&](const at::Tensor& y) { return y.view({b, t, kHeads, hd}).transpose(1, 2); };
    at::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    at::Tensor att = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    at::Tensor mask = at::ones({t, t}, at::kBool).triu(1);
    att = at::softmax(att.masked_fill(mask, -1e9), -1);
    at::Tensor y = at::matmul(att, v).transpose(1, 2).reshape({b, t, kDim});
    x = x + proj(y);
    return x + out(at::gelu(fc(ln2(x))));
  }
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc, out;
};

/// Embedding, two blocks in a Sequential, LayerNorm, output weights tied to the
/// embedding's.
struct TinyGptImpl : torch::nn::Module {
  TinyGptImpl()
      : wte(register_module("wte", torch::nn::Embedding(kVocab, kDim))),
        wpe(register_module("wpe", torch::nn::Embedding(kCtx, kDim))),
        blocks(register_module("blocks", torch::nn::Sequential(std::make_shared<BlockImpl>(),
                                                               std::make_shared<BlockImpl>()))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})))) {}
  at::Tensor forward(at::Tensor idx) {
    at::Tensor x = wte(idx) + wpe(at::arange(idx.size(1), at::kLong));
    x = ln_f(blocks->forward(x));
    return torch::nn::functional::linear(x, wte->weight);
  }
  torch::nn::Embedding wte, wpe;
  torch::nn::Sequential blocks;
  torch::nn::LayerNorm ln_f;
};

}  // namespace ddp_test
