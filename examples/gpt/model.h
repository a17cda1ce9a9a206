#pragma once

// The GPT of examples/gpt.cpp: a decoder-only transformer over characters (GPT-2's
// layout, minGPT's sizes as flags). Submodule names are the attribute names of the
// Python twin (examples/gpt/gpt.py), so the state dict reads "wte.weight",
// "blocks.0.attn.q.weight", ... and loads into it.
//
//   idx [B, T] -> wte(idx) + wpe(0..T-1) -> dropout -> N x Block -> ln_f
//              -> logits [B, T, vocab] = x @ wte.weight^T      (output tied to wte)
//   Block: x + attn(ln_1(x)), then x + mlp(ln_2(x))              (pre-LayerNorm)
//   attn:  causal self-attention, n_head heads (scaled_dot_product_attention where
//          LibTorch has it, the same arithmetic written out in LibTorch 1.13)
//   mlp:   fc (4 n_embd) -> GELU -> proj -> dropout
//
// Note [No bias on qkv]
// GPT-2's qkv projection has a bias; these have none (as LLaMA's, or nanoGPT with
// bias=False). The key's third of that bias adds the same number to every score of a
// query's row, which softmax cancels: its gradient is zero in exact arithmetic, so what
// AdamW sees is rounding noise, divided by its own magnitude (about lr per step in a
// random direction). Two correct implementations then drift apart in those entries by
// 1e-3 relative in 20 steps while every other weight agrees to 1e-6; without it, the C++
// model and its Python twin agree everywhere. The query's and value's biases go with it;
// the loss does not notice.
//
// Note [Tensor-parallel GPT]
// q, k, v, proj, fc and mlp.proj are ddp::TensorParallel fields: plain Linears until
// `gpt --tp N` applies a plan (ColwiseParallel on q, k, v and fc, RowwiseParallel on the
// two proj). The three projections are separate (LLaMA's wq, wk, wv; torchtitan's plan)
// so that ColwiseParallel's chunks of each are whole heads: a fused [3C, C] weight split
// by rows would give one rank all the queries. Attention then runs on the rank's
// n_head / N heads (counted from q's output width). The embeddings, the LayerNorms and
// the tied output layer stay whole on every rank.

#include <ddp/parallel/pipelining.h>
#include <ddp/parallel/tensor_parallel.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

struct GptConfig {
  int64_t vocab_size = 0;
  int64_t block_size = 64;  // the longest context
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.1;  // after the embeddings, on attention weights, after each residual branch
};

struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(const GptConfig& config);
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]

  int64_t n_head;
  double dropout;
  // Note [Tensor-parallel GPT]
  ddp::TensorParallel<torch::nn::LinearImpl> q{nullptr}, k{nullptr}, v{nullptr}, proj{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

struct MlpImpl : torch::nn::Module {
  MlpImpl(const GptConfig& config);
  at::Tensor forward(const at::Tensor& x);

  double dropout;
  ddp::TensorParallel<torch::nn::LinearImpl> fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const GptConfig& config);
  at::Tensor forward(at::Tensor x);

  torch::nn::LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  /// GPT-2's initialisation from torch's default generator: weights N(0, 0.02) (the
  /// residual projections N(0, 0.02 / sqrt(2 n_layer))), biases 0, LayerNorms 1 and 0.
  explicit GptImpl(const GptConfig& config);
  at::Tensor forward(const at::Tensor& idx);  // [B, T] int64 -> logits [B, T, vocab]

  /// Whether this parameter gets weight decay: the weights of Linear layers (minGPT's
  /// rule). Biases, LayerNorms and the embeddings (wte is also the output layer) do not.
  static bool decays(const std::string& name, const at::Tensor& parameter);

  GptConfig config;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Sequential blocks{nullptr};  // of Block; ddp::fully_shard puts units in place
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(Gpt);

/// The part of `model` that pipeline stage `stage` of `stages` runs (gpt --pp): the first
/// stage the embeddings, every stage its share of the blocks (pipeline_slice's split),
/// the last stage ln_f and the output layer, which is tied to wte: the last stage holds
/// wte too (its own copy, on another rank), and gpt --pp sums the two copies' gradients.
/// The modules are `model`'s own, registered under the same names, so the stage's
/// state-dict keys are the model's. forward: token ids (first stage) or activations
/// [B, T, C] in; activations or logits out.
struct GptStageImpl : torch::nn::Module {
  GptStageImpl(const GptImpl& model, int stage, int stages);
  at::Tensor forward(const at::Tensor& x);

  GptConfig config;
  bool first, last;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Sequential blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(GptStage);

/// Samples `length` characters after `prompt` (token ids, non-empty) from `model` on
/// `device`: softmax of the last position's logits at temperature 1, the context cut
/// to the last block_size tokens. Runs in eval mode without gradients; deterministic
/// for a seed.
std::vector<int64_t> generate(GptImpl& model, std::vector<int64_t> prompt, int64_t length,
                              uint64_t seed);

}  // namespace gpt
