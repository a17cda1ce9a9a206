// GradScaler's state dict: Python's keys and value types.

#include "amp/scaler_state.h"
#include "distributed/common/check.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <sstream>

namespace ddp {
namespace amp {
namespace detail {

namespace {

constexpr const char* kKeys[] = {"scale", "growth_factor", "backoff_factor", "growth_interval",
                                 "_growth_tracker"};

std::string key_list(const c10::impl::GenericDict& dict) {
  std::ostringstream out;
  bool first = true;
  for (const auto& entry : dict) {
    out << (first ? "" : ", ")
        << (entry.key().isString() ? entry.key().toStringRef() : entry.key().tagKind());
    first = false;
  }
  return out.str();
}

c10::IValue value_of(const c10::impl::GenericDict& dict, const char* key,
                     const std::string& where) {
  const auto it = dict.find(key);
  DDP_CHECK(it != dict.end(), where, ": the GradScaler state has no key '", key,
            "'; expected the keys of GradScaler.state_dict(): scale, growth_factor, "
            "backoff_factor, growth_interval, _growth_tracker (it has: ",
            key_list(dict), ")");
  return it->value();
}

// Python writes whole floats as float, but a hand-made dict may hold an int.
double number(const c10::impl::GenericDict& dict, const char* key, const std::string& where) {
  const c10::IValue v = value_of(dict, key, where);
  DDP_CHECK(v.isDouble() || v.isInt(), where, ": GradScaler state '", key,
            "' should be a float, but it is a ", v.tagKind());
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

int64_t integer(const c10::impl::GenericDict& dict, const char* key, const std::string& where) {
  const c10::IValue v = value_of(dict, key, where);
  DDP_CHECK(v.isInt(), where, ": GradScaler state '", key, "' should be an int, but it is a ",
            v.tagKind());
  return v.toInt();
}

}  // namespace

c10::impl::GenericDict scaler_state_dict(const ScalerState& state) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert(kKeys[0], state.scale);
  d.insert(kKeys[1], state.growth_factor);
  d.insert(kKeys[2], state.backoff_factor);
  d.insert(kKeys[3], state.growth_interval);
  d.insert(kKeys[4], state.growth_tracker);
  return d;
}

ScalerState parse_scaler_state(const c10::impl::GenericDict& dict, const std::string& where) {
  ScalerState s;
  s.scale = number(dict, kKeys[0], where);
  s.growth_factor = number(dict, kKeys[1], where);
  s.backoff_factor = number(dict, kKeys[2], where);
  s.growth_interval = integer(dict, kKeys[3], where);
  s.growth_tracker = integer(dict, kKeys[4], where);
  DDP_CHECK(std::isfinite(s.scale) && s.scale > 0, where,
            ": GradScaler state 'scale' should be a finite number > 0, but it is ", s.scale);
  DDP_CHECK(s.growth_factor > 1.0, where,
            ": GradScaler state 'growth_factor' should be > 1.0, but it is ", s.growth_factor);
  DDP_CHECK(s.backoff_factor > 0.0 && s.backoff_factor < 1.0, where,
            ": GradScaler state 'backoff_factor' should be in (0, 1), but it is ",
            s.backoff_factor);
  DDP_CHECK(s.growth_interval >= 1, where,
            ": GradScaler state 'growth_interval' should be >= 1, but it is ", s.growth_interval);
  DDP_CHECK(s.growth_tracker >= 0 && s.growth_tracker <= INT32_MAX, where,
            ": GradScaler state '_growth_tracker' should be in [0, 2^31), but it is ",
            s.growth_tracker);
  return s;
}

}  // namespace detail
}  // namespace amp
}  // namespace ddp
