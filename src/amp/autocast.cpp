// AutocastGuard: torch.autocast's __enter__ and __exit__ for C++.

#include <ddp/amp/autocast.h>

#include "amp/autocast_compat.h"
#include "distributed/common/check.h"

#include <c10/util/Exception.h>

namespace ddp {
namespace amp {

namespace {

bool has_autocast(c10::DeviceType device_type) {
  return device_type == c10::DeviceType::CPU || device_type == c10::DeviceType::CUDA;
}

void check_device_type(c10::DeviceType device_type, const char* what) {
  DDP_CHECK(has_autocast(device_type), what,
            ": autocast supports device types cpu and cuda, but got ",
            c10::DeviceTypeName(device_type, /*lower_case=*/true), ".");
}

at::ScalarType default_dtype(c10::DeviceType device_type) {
  return device_type == c10::DeviceType::CPU ? at::kBFloat16 : at::kHalf;
}

}  // namespace

AutocastGuard::AutocastGuard(c10::DeviceType device_type, const AutocastOptions& options)
    : device_type_(device_type) {
  if (!options.enabled() && !has_autocast(device_type)) {
    active_ = false;  // nothing to turn off (the device stand-in, docs/gpu.md)
    return;
  }
  check_device_type(device_type, "AutocastGuard");
  const at::ScalarType dtype = options.dtype().value_or(default_dtype(device_type));
  DDP_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf,
            "AutocastGuard: dtype must be BFloat16 or Half (the lower precision that "
            "eligible operations run in), but got ",
            dtype, ".");
  // As torch.autocast.__enter__: remember, set the dtype, enable, count the nesting.
  previous_enabled_ = detail::autocast_enabled(device_type);
  previous_dtype_ = detail::autocast_dtype(device_type);
  previous_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
  detail::set_autocast_dtype_for(device_type, dtype);
  detail::set_autocast_enabled_for(device_type, options.enabled());
  at::autocast::set_autocast_cache_enabled(options.cache_enabled());
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // As torch.autocast.__exit__: the weight copies cached in this region are dropped when
  // the outermost region ends, so the next region sees the weights the optimizer updated.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  detail::set_autocast_enabled_for(device_type_, previous_enabled_);
  detail::set_autocast_dtype_for(device_type_, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(previous_cache_enabled_);
}

bool is_autocast_enabled(c10::DeviceType device_type) {
  check_device_type(device_type, "is_autocast_enabled");
  return detail::autocast_enabled(device_type);
}

at::ScalarType get_autocast_dtype(c10::DeviceType device_type) {
  check_device_type(device_type, "get_autocast_dtype");
  return detail::autocast_dtype(device_type);
}

}  // namespace amp
}  // namespace ddp
