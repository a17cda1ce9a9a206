#pragma once

// Autocast regions, as torch.autocast in Python: eligible operations run in a lower
// precision (bfloat16 on the CPU, float16 on CUDA) while the parameters, their gradients,
// DDP's buckets and the optimizer stay float32. Used with ddp::amp::GradScaler
// (ddp/amp/grad_scaler.h) for float16.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <optional>

namespace ddp {
namespace amp {

/// What an AutocastGuard enables. As torch.autocast's arguments.
///
/// Example:
///   ddp::amp::AutocastOptions().dtype(at::kBFloat16).cache_enabled(false);
struct AutocastOptions {
  /// The lower precision: kBFloat16 or kHalf. Unset: the device's default, kBFloat16 on
  /// the CPU and kHalf on CUDA. LibTorch 1.13's CPU autocast supports only kBFloat16.
  TORCH_ARG(std::optional<at::ScalarType>, dtype) = std::nullopt;
  /// false: the guard disables autocast for its scope (e.g. a float32 block inside an
  /// autocast region).
  TORCH_ARG(bool, enabled) = true;
  /// Reuse the low-precision copy of each weight within the outermost region.
  TORCH_ARG(bool, cache_enabled) = true;
};

/// Runs eligible operations (matmul, convolution, ...) of this thread in lower precision
/// until the guard leaves scope, then restores the previous autocast state; leaving the
/// outermost region clears the cache of weight copies. Open it around the forward pass
/// and the loss, not around backward() or the optimizer step: the parameters stay
/// float32, so their gradients, DDP's buckets and the optimizer stay float32 too.
///
/// Example:
///   { ddp::amp::AutocastGuard autocast(at::kCPU);  // bfloat16
///     loss = loss_fn(dmodel->forward(x), y); }
class AutocastGuard {
 public:
  /// device_type: at::kCPU or at::kCUDA. On another device a disabled guard does
  /// nothing (so code written for both, like the example's, runs there), and an
  /// enabled one throws.
  explicit AutocastGuard(c10::DeviceType device_type,
                         const AutocastOptions& options = AutocastOptions());
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool active_ = true;  // false: disabled, on a device without autocast
  bool previous_enabled_;
  at::ScalarType previous_dtype_;
  bool previous_cache_enabled_;
};

/// Whether autocast is enabled for `device_type` on this thread.
bool is_autocast_enabled(c10::DeviceType device_type);
/// The lower-precision dtype autocast uses for `device_type` on this thread.
at::ScalarType get_autocast_dtype(c10::DeviceType device_type);

}  // namespace amp
}  // namespace ddp
