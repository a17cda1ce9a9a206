#pragma once

// Autocast state across LibTorch versions (docs/libtorch.md). LibTorch 1.13 has one set
// of functions per device (is_cpu_enabled / set_cpu_enabled / get_ and
// set_autocast_cpu_dtype for the CPU; is_enabled / set_enabled / get_ and
// set_autocast_gpu_dtype for CUDA); 2.x has device-generic ones (is_autocast_enabled,
// set_autocast_enabled, get_autocast_dtype, set_autocast_dtype, taking the device type)
// and deprecates the old ones. Which set exists is found by overload resolution, not by
// a version number (Note [Autocast API probe]).

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <type_traits>

// Note [Autocast API probe]
// The probe's declaration lives in a namespace of its own at global scope and reaches the
// probing scope through a using-directive, as at::autocast's functions do, so that an
// unqualified call sees both in one overload set. Where at::autocast has the
// device-generic function, its exact, non-template match wins; where it has none, only
// the probe's template is viable and the call's type is Missing. The probe is declared,
// never defined: it is only named inside decltype.
namespace ddp_autocast_probe {
struct Missing {};
template <typename Device, typename Bool>
Missing set_autocast_enabled(Device, Bool);
}  // namespace ddp_autocast_probe

// The shims live at global scope too: an unqualified name used inside namespace ddp
// would find ddp::amp's own is_autocast_enabled and get_autocast_dtype (which call these)
// before at::autocast's.
namespace ddp_autocast_compat {

namespace probe_scope {
using namespace ::at::autocast;
using namespace ::ddp_autocast_probe;
constexpr bool kDeviceGeneric =
    !std::is_same<decltype(set_autocast_enabled(c10::DeviceType::CPU, true)),
                  ::ddp_autocast_probe::Missing>::value;
}  // namespace probe_scope

/// Whether this LibTorch has the device-generic autocast functions (2.x).
constexpr bool kDeviceGenericAutocast = probe_scope::kDeviceGeneric;

// Every call below passes `none...`, an empty pack, which makes it a dependent call:
// overload resolution (and with it any error or deprecation warning) waits until
// instantiation, and `if constexpr` instantiates only the branch this LibTorch has. The
// other branch names functions that this LibTorch lacks (1.13) or deprecates (2.x).

template <typename... None>
bool autocast_enabled(c10::DeviceType device, None... none) {
  using namespace ::at::autocast;
  if constexpr (kDeviceGenericAutocast) {
    return is_autocast_enabled(device, none...);
  } else {
    return device == c10::DeviceType::CPU ? is_cpu_enabled(none...) : is_enabled(none...);
  }
}

template <typename... None>
void set_autocast_enabled_for(c10::DeviceType device, bool enabled, None... none) {
  using namespace ::at::autocast;
  if constexpr (kDeviceGenericAutocast) {
    set_autocast_enabled(device, enabled, none...);
  } else if (device == c10::DeviceType::CPU) {
    set_cpu_enabled(enabled, none...);
  } else {
    set_enabled(enabled, none...);
  }
}

template <typename... None>
at::ScalarType autocast_dtype(c10::DeviceType device, None... none) {
  using namespace ::at::autocast;
  if constexpr (kDeviceGenericAutocast) {
    return get_autocast_dtype(device, none...);
  } else {
    return device == c10::DeviceType::CPU ? get_autocast_cpu_dtype(none...)
                                          : get_autocast_gpu_dtype(none...);
  }
}

template <typename... None>
void set_autocast_dtype_for(c10::DeviceType device, at::ScalarType dtype, None... none) {
  using namespace ::at::autocast;
  if constexpr (kDeviceGenericAutocast) {
    set_autocast_dtype(device, dtype, none...);
  } else if (device == c10::DeviceType::CPU) {
    set_autocast_cpu_dtype(dtype, none...);
  } else {
    set_autocast_gpu_dtype(dtype, none...);
  }
}

}  // namespace ddp_autocast_compat

namespace ddp {
namespace amp {
namespace detail {
using ::ddp_autocast_compat::autocast_dtype;
using ::ddp_autocast_compat::autocast_enabled;
using ::ddp_autocast_compat::kDeviceGenericAutocast;
using ::ddp_autocast_compat::set_autocast_dtype_for;
using ::ddp_autocast_compat::set_autocast_enabled_for;
}  // namespace detail
}  // namespace amp
}  // namespace ddp
