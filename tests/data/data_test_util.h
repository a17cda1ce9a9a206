#pragma once

// Datasets shared by the data tests.

#include "support/harness.h"

#include <torch/data.h>

#include <cstddef>
#include <cstdint>

namespace ddp_test {

/// Dataset whose example i is (tensor(i), tensor(i)): a loader's batches show the
/// indices the sampler handed out.
struct IndexDataset : torch::data::datasets::Dataset<IndexDataset> {
  explicit IndexDataset(size_t n) : n_(n) {}
  torch::data::Example<> get(size_t index) override {
    const auto t = torch::tensor(static_cast<int64_t>(index));
    return {t, t};
  }
  torch::optional<size_t> size() const override { return n_; }
  size_t n_;
};

}  // namespace ddp_test
