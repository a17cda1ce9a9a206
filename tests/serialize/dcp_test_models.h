#pragma once

// The test transformer of fsdp_test_models.h for the DCP tests: built with weights from a
// seed, and sharded with fully_shard on each block and on the root.

#include "parallel/fsdp_test_models.h"
#include "support/harness.h"

#include <ddp/fsdp/fully_shard.h>

#include <ATen/CPUGeneratorImpl.h>

#include <memory>

namespace ddp_test {

/// TinyGpt with every parameter N(0, 0.3^2) from a generator seeded with `seed`.
inline std::shared_ptr<TinyGptImpl> make_tiny_gpt(uint64_t seed) {
  auto model = std::make_shared<TinyGptImpl>();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.3);
  return model;
}

/// fully_shard on each block of `model`, then on the root, over `pg`; returns the root's unit.
inline ddp::FullyShard<TinyGptImpl> shard_tiny_gpt(const std::shared_ptr<TinyGptImpl>& model,
                                                   ddp::ProcessGroup& pg) {
  auto opts = ddp::FullyShardOptions().process_group(borrow(pg));
  for (size_t i = 0; i < model->blocks->size(); ++i) {
    ddp::fully_shard(model->blocks->ptr<BlockImpl>(i), opts);
  }
  return ddp::fully_shard(model, opts);
}

}  // namespace ddp_test
