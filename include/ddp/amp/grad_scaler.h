#pragma once

// The gradient scaler of mixed precision, as torch.amp.GradScaler in Python, working with
// DistributedDataParallel. Autocast regions are in ddp/amp/autocast.h.
//
// Example (fp16 on a GPU; on a CPU use at::kBFloat16 and GradScalerOptions().enabled(false)):
//   ddp::amp::GradScaler scaler;                          // init_scale 2^16, ...
//   for (auto& [x, y] : batches) {
//     optimizer.zero_grad();
//     at::Tensor loss;
//     {
//       ddp::amp::AutocastGuard autocast(at::kCUDA);    // forward and loss only
//       loss = torch::nn::functional::cross_entropy(dmodel->forward(x), y);
//     }
//     scaler.scale(loss).backward();     // DDP averages the scaled fp32 gradients
//     scaler.step(optimizer);            // unscales; skips the step on inf/NaN
//     scaler.update();                   // backs off after a skip, grows after 2000 good steps
//   }
//
// Across ranks (Note [Found-inf across ranks] in src/amp/grad_scaler.cpp): after DDP's
// all-reduce every rank holds the same gradients, bit for bit, and an inf or NaN on one
// rank is an inf or NaN in the sum everywhere, so every rank skips the same steps with no
// extra communication. Where gradients are not synchronised before step() (a sharded
// optimizer, gradients reduced by hand), set GradScalerOptions::process_group: the flag is
// then all-reduced with MAX.

#include <ddp/distributed/process_group.h>

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace ddp {
namespace amp {

// ---- Gradient scaling ------------------------------------------------------------------

/// How a GradScaler scales. Names and defaults are torch.amp.GradScaler's.
///
/// Example:
///   ddp::amp::GradScalerOptions().init_scale(1024).growth_interval(100);
struct GradScalerOptions {
  /// The first scale.
  TORCH_ARG(double, init_scale) = 65536.0;
  /// Multiplies the scale after growth_interval steps in a row without inf/NaN; > 1.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// Multiplies the scale after a step with inf/NaN gradients; in (0, 1).
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Steps in a row without inf/NaN before the scale grows; >= 1.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// false: scale() returns its input, step() just steps, update() does nothing.
  TORCH_ARG(bool, enabled) = true;
  /// nullptr (the default, and right under DDP): each rank decides from its own
  /// gradients, which DDP has already made identical. Set it when the gradients are not
  /// synchronised before step() (a sharded optimizer, gradients reduced by hand): the
  /// found-inf flag is then all-reduced with MAX over this group in unscale_(), so that
  /// every rank skips the same steps. Every rank of the group must then call unscale_()
  /// or step() for the same optimizers in the same order.
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
};

/// Scales the loss so that small fp16 gradients do not underflow, unscales the gradients
/// before the optimizer uses them, skips steps whose gradients hold an inf or a NaN, and
/// adapts the scale: torch.amp.GradScaler's semantics (and its error messages).
///
/// The scale is a float32 tensor on the device of the first tensor given to scale();
/// the inf/NaN check and the update use ATen's fused kernels where the LibTorch in use
/// has them for that device, else plain tensor operations with the same results.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = GradScalerOptions());
  // A copy would share the scale tensor and change with the original: not copyable.
  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;
  GradScaler(GradScaler&&) = default;
  GradScaler& operator=(GradScaler&&) = default;

  /// outputs * scale (outputs itself when disabled). The first call places the scale on
  /// outputs' device.
  at::Tensor scale(const at::Tensor& outputs);
  /// Each tensor times the scale.
  std::vector<at::Tensor> scale(const std::vector<at::Tensor>& outputs);

  /// Divides the gradients of `optimizer`'s parameters by the scale, in place, and
  /// records whether any was inf or NaN. Optional: step() calls it when it has not been
  /// called; call it yourself to clip or inspect unscaled gradients. At most once per
  /// optimizer between update()s. Float16 gradients are refused (keep float32 weights).
  void unscale_(torch::optim::Optimizer& optimizer);

  /// Unscales (unless unscale_ was called) and runs optimizer.step() unless a gradient
  /// was inf or NaN. Returns whether the optimizer stepped (Python returns the step's
  /// result, None when skipped). Once per optimizer between update()s.
  bool step(torch::optim::Optimizer& optimizer);

  /// Ends the iteration: after any skipped step, scale *= backoff_factor; after
  /// growth_interval unskipped iterations in a row, scale *= growth_factor (unless that
  /// would overflow float32).
  void update();
  /// Ends the iteration with this scale instead.
  void update(double new_scale);
  /// Ends the iteration with this scale instead: a one-element tensor without grad.
  void update(const at::Tensor& new_scale);

  /// The current scale; init_scale before the first scale(), 1.0 when disabled.
  double get_scale() const;
  double get_growth_factor() const { return options_.growth_factor(); }
  void set_growth_factor(double growth_factor);
  double get_backoff_factor() const { return options_.backoff_factor(); }
  void set_backoff_factor(double backoff_factor);
  int64_t get_growth_interval() const { return options_.growth_interval(); }
  void set_growth_interval(int64_t growth_interval);
  bool is_enabled() const { return options_.enabled(); }
  const GradScalerOptions& options() const { return options_; }

  /// Python's keys, in Python's order: "scale" (float), "growth_factor" (float),
  /// "backoff_factor" (float), "growth_interval" (int), "_growth_tracker" (int: unskipped
  /// steps in a row). Empty when disabled. torch.amp.GradScaler.load_state_dict reads it.
  /// Call it after update().
  c10::impl::GenericDict state_dict() const;
  /// Restores state_dict()'s values (also one written by Python). Every key and type is
  /// checked before anything changes. A no-op when disabled; an empty dict (saved by a
  /// disabled scaler) is refused, as in Python.
  void load_state_dict(const c10::impl::GenericDict& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct OptimizerState {
    const torch::optim::Optimizer* optimizer = nullptr;
    Stage stage = Stage::kReady;
    /// Per device of the gradients, a float32 flag: > 0 when one was inf or NaN.
    std::vector<std::pair<c10::Device, at::Tensor>> found_inf_per_device;
  };

  OptimizerState& state_of(const torch::optim::Optimizer& optimizer);
  void check_initialised(const char* what) const;
  void unscale_grads(torch::optim::Optimizer& optimizer, OptimizerState& state);

  GradScalerOptions options_;
  at::Tensor scale_;           // float32, one element; undefined until the first scale()
  at::Tensor growth_tracker_;  // int32, one element; created with scale_
  int64_t init_growth_tracker_ = 0;
  std::deque<OptimizerState> per_optimizer_;  // this iteration's, cleared by update()
};

}  // namespace amp
}  // namespace ddp
