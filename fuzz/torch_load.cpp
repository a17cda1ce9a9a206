// Fuzz target: reading a torch.save / ddp::save_checkpoint file as a whole, bytes in and
// a value or a clear refusal out: src/formats/pickle_io.cpp's unpickle (the zip reader,
// Note [Integrity check]; the rewrite of Python pickles, pickle_compat.cpp; then
// LibTorch's own unpickler, uninstrumented), and then what a checkpoint loader does
// first with the value: tensor_dict (src/formats/pickle_io.h) for the model, and the
// checks that come before any change for the optimizer (prepare_optimizer_load, against a
// small model's AdamW with state) and the RNG (prepare_rng_load). What they return is not
// applied, so that every input meets the same optimizer.
//
// A refusal must be a c10::Error (or another std::exception) whose message names
// `where`. rewrite_python_pickle is also run on the input itself, as a pickle: it must
// return (within libFuzzer's time and memory limits) whatever the bytes.
#include "formats/optimizer_state.h"
#include "formats/pickle_compat.h"
#include "formats/pickle_io.h"
#include "formats/rng_state.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "fuzz_check.h"

namespace {

const char kWhere[] = "fuzz input";

void refused(const std::exception& e) { ddp_fuzz::expect_names_file(e, kWhere); }

// A model and an optimizer that has taken one step (so it has state to compare).
struct Trained {
  torch::nn::Linear model{torch::nn::LinearOptions(3, 2)};
  torch::optim::AdamW optimizer{model->parameters(), torch::optim::AdamWOptions(0.1)};
  Trained() {
    model->forward(torch::ones({1, 3})).sum().backward();
    optimizer.step();
  }
};

// Runs `check` on `value` if it is there; a refusal must name the file.
template <typename F>
void loader_step(const F& check) {
  try {
    check();
  } catch (const std::exception& e) {
    refused(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  // The pickle rewriter on its own (our parser of Python pickles).
  (void)ddp::detail::rewrite_python_pickle(bytes);
  c10::IValue value;
  try {
    value = ddp::detail::unpickle(bytes, kWhere);
  } catch (const std::exception& e) {
    refused(e);
    return 0;
  }
  // What the checkpoint loaders ask of it first.
  static Trained* trained = new Trained();
  loader_step([&] { (void)ddp::detail::tensor_dict(value, "the model's state", kWhere); });
  loader_step([&] {
    (void)ddp::detail::prepare_optimizer_load(trained->optimizer, *trained->model, value, kWhere);
  });
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    for (const char* key : {"model", "optimizer", "rng"}) {
      const auto it = dict.find(key);
      if (it == dict.end()) continue;
      const c10::IValue part = it->value();
      if (std::string(key) == "model") {
        loader_step([&] { (void)ddp::detail::tensor_dict(part, "the model's state", kWhere); });
      } else if (std::string(key) == "optimizer") {
        loader_step([&] {
          (void)ddp::detail::prepare_optimizer_load(trained->optimizer, *trained->model, part,
                                                    kWhere);
        });
      } else {
        loader_step([&] { (void)ddp::detail::prepare_rng_load(part, "the RNG state", kWhere); });
      }
    }
  }
  return 0;
}
