#pragma once

// Clocks for stats and traces. Durations use the steady clock; trace timestamps are
// steady times shifted onto the system clock once per process, so that the files of
// ranks on one host line up in Perfetto while staying monotonic.

#include <cstdint>

namespace ddp {
namespace detail {

int64_t steady_now_ns();

/// Microseconds on the (shifted) system clock, for a steady_now_ns() value.
int64_t trace_us(int64_t steady_ns);

inline int64_t trace_now_us() { return trace_us(steady_now_ns()); }

}  // namespace detail
}  // namespace ddp
