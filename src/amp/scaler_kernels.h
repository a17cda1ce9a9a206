#pragma once

// The two numeric steps of gradient scaling, with torch.amp.GradScaler's arithmetic:
// ATen's fused kernels where this LibTorch has them for the tensors' device, plain
// tensor operations with the same results elsewhere (LibTorch 1.13 has CUDA kernels
// only). Note [Scaler arithmetic] in scaler_kernels.cpp says what "the same" means.

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>

#include <cstdint>
#include <vector>

namespace ddp {
namespace amp {
namespace detail {

enum class KernelPath {
  kAuto,   // fused where available, else plain
  kPlain,  // always the plain operations (tests compare the two)
};

/// Whether ATen has kernels for _amp_foreach_non_finite_check_and_unscale_ and
/// _amp_update_scale_ on `device_type` in this LibTorch.
bool has_fused_kernels(c10::DeviceType device_type);

/// For each gradient (one dtype and device): found_inf = 1 if any element is inf or NaN
/// (found_inf is not reset), then grad *= inv_scale in place, computed in float32 for
/// reduced-precision gradients. found_inf and inv_scale: one-element float32 tensors on
/// the gradients' device.
void non_finite_check_and_unscale(const std::vector<at::Tensor>& grads, at::Tensor& found_inf,
                                  const at::Tensor& inv_scale, KernelPath path = KernelPath::kAuto);

/// One update of the scale (float32) and growth tracker (int32), one element each:
/// found_inf > 0: scale *= backoff_factor, tracker = 0; else tracker + 1, and when that
/// reaches growth_interval, scale *= growth_factor (kept if finite) and tracker = 0.
void update_scale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t growth_interval,
                  KernelPath path = KernelPath::kAuto);

}  // namespace detail
}  // namespace amp
}  // namespace ddp
