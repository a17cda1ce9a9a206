// Inf/NaN check, unscale and scale update: fused ATen kernels or plain tensor operations.

#include "amp/scaler_kernels.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace ddp {
namespace amp {
namespace detail {

// Note [Scaler arithmetic]
// The plain path reproduces ATen's CPU kernels (aten/src/ATen/native/cpu/
// AmpGradScalerKernels.cpp), which torch.amp.GradScaler("cpu") runs:
//  - unscale: a float32 or float64 gradient is multiplied by the float32 inv_scale in its
//    own precision (float32 * float32, or float64 * float64 after exact widening); a
//    float16 or bfloat16 gradient is widened to float32, multiplied, and rounded back
//    (to nearest even), as the kernel's opmath does. The inf/NaN test looks at the
//    gradient before the multiplication.
//  - update: the float32 scale times the factor is computed in double and rounded to
//    float32 once; a grown scale is kept only if finite.
// With factors that are powers of two (the defaults) every product is exact and CUDA's
// kernel (which rounds the factor to float32 first) agrees too.

namespace {

bool has_kernel(const char* op, c10::DispatchKey key) {
  const auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
  return handle.has_value() && handle->hasKernelForDispatchKey(key);
}

bool probe(c10::DispatchKey key) {
  return has_kernel("aten::_amp_foreach_non_finite_check_and_unscale_", key) &&
         has_kernel("aten::_amp_update_scale_", key);
}

void plain_check_and_unscale(const std::vector<at::Tensor>& grads, at::Tensor& found_inf,
                             const at::Tensor& inv_scale) {
  for (const at::Tensor& grad : grads) {
    // A 0-dim bool on the gradients' device: no host synchronisation.
    found_inf.masked_fill_(grad.isfinite().all().logical_not(), 1.0);
    const at::ScalarType dtype = grad.scalar_type();
    if (dtype == at::kHalf || dtype == at::kBFloat16) {
      at::Tensor g = grad;  // a handle: copy_ writes the gradient in place
      g.copy_(grad.to(at::kFloat).mul_(inv_scale));
    } else {
      at::Tensor g = grad;
      g.mul_(inv_scale);
    }
  }
}

void plain_update_scale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                        double growth_factor, double backoff_factor, int64_t growth_interval) {
  const float current = scale.item<float>();
  if (found_inf.item<float>() != 0.0f) {
    scale.fill_(static_cast<float>(current * backoff_factor));
    growth_tracker.fill_(0);
    return;
  }
  const int64_t successful = growth_tracker.item<int32_t>() + int64_t{1};
  if (successful == growth_interval) {
    const float grown = static_cast<float>(current * growth_factor);
    if (std::isfinite(grown)) scale.fill_(grown);
    growth_tracker.fill_(0);
  } else {
    growth_tracker.fill_(successful);
  }
}

}  // namespace

bool has_fused_kernels(c10::DeviceType device_type) {
  static const bool cpu = probe(c10::DispatchKey::CPU);
  static const bool cuda = probe(c10::DispatchKey::CUDA);
  if (device_type == c10::DeviceType::CPU) return cpu;
  if (device_type == c10::DeviceType::CUDA) return cuda;
  return false;
}

void non_finite_check_and_unscale(const std::vector<at::Tensor>& grads, at::Tensor& found_inf,
                                  const at::Tensor& inv_scale, KernelPath path) {
  if (grads.empty()) return;
  TORCH_INTERNAL_ASSERT(found_inf.scalar_type() == at::kFloat && found_inf.numel() == 1 &&
                        inv_scale.scalar_type() == at::kFloat && inv_scale.numel() == 1);
  if (path == KernelPath::kAuto && has_fused_kernels(grads.front().device().type())) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  } else {
    plain_check_and_unscale(grads, found_inf, inv_scale);
  }
}

void update_scale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                  double growth_factor, double backoff_factor, int64_t growth_interval,
                  KernelPath path) {
  TORCH_INTERNAL_ASSERT(scale.scalar_type() == at::kFloat && scale.numel() == 1 &&
                        growth_tracker.scalar_type() == at::kInt && growth_tracker.numel() == 1 &&
                        found_inf.numel() == 1);
  if (path == KernelPath::kAuto && has_fused_kernels(scale.device().type())) {
    at::_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                           growth_interval);
  } else {
    plain_update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                       growth_interval);
  }
}

}  // namespace detail
}  // namespace amp
}  // namespace ddp
