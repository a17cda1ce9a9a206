#pragma once

// Small models, datasets and checks shared by the data tests.

#include <torch/data.h>
#include <torch/nn.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <string>

namespace ddp_test {

/// The exception text of f(), or "<no exception>". c10::Error's message without its
/// backtrace, so that substrings can be pinned.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.msg();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

/// Same dtype, shape and bytes (bit-identical, unlike torch::equal for -0.0 and NaN).
inline bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous().cpu();
  const at::Tensor cb = b.contiguous().cpu();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

/// A small convolutional net with buffers (BatchNorm) and a child Sequential, named
/// like its Python twin in tests/data/python/checkpoint_reference.py.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(4))),
        head(register_module(
            "head", torch::nn::Sequential(torch::nn::Linear(4 * 4 * 4, 8), torch::nn::ReLU(),
                                          torch::nn::Linear(8, 3)))) {}
  at::Tensor forward(at::Tensor x) {
    x = torch::relu(bn1(conv1(x)));
    return head->forward(x.flatten(1));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Sequential head;
};
TORCH_MODULE(Net);

/// Dataset whose example i is (tensor(i), tensor(i)): a loader's batches show the
/// indices the sampler handed out.
struct IndexDataset : torch::data::datasets::Dataset<IndexDataset> {
  explicit IndexDataset(size_t n) : n_(n) {}
  torch::data::Example<> get(size_t index) override {
    const auto t = torch::tensor(static_cast<int64_t>(index));
    return {t, t};
  }
  c10::optional<size_t> size() const override { return n_; }
  size_t n_;
};

} // namespace ddp_test
