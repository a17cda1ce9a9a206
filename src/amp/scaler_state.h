#pragma once

// GradScaler::state_dict()'s layout, shared by load_state_dict and load_checkpoint (which
// validates every part of a checkpoint before applying any).

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>

namespace ddp {
namespace amp {
namespace detail {

struct ScalerState {
  double scale = 0;
  double growth_factor = 0;
  double backoff_factor = 0;
  int64_t growth_interval = 0;
  int64_t growth_tracker = 0;
};

/// The keys of torch.amp.GradScaler.state_dict(), in its order.
c10::impl::GenericDict scaler_state_dict(const ScalerState& state);

/// Reads a non-empty state_dict(); throws, starting with `where`, on a missing key, a
/// value of the wrong type or out of range (scale <= 0 or not finite, growth_factor <= 1,
/// backoff_factor outside (0, 1), growth_interval < 1, _growth_tracker < 0).
ScalerState parse_scaler_state(const c10::impl::GenericDict& dict, const std::string& where);

}  // namespace detail
}  // namespace amp
}  // namespace ddp
