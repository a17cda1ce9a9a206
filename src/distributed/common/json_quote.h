#pragma once

// The library writes its small JSON files (traces, flight recorder) by hand, so that it
// needs no JSON dependency; this is the one place that escapes strings for them.

#include <string>

namespace ddp {
namespace detail {

/// JSON string literal for `s`, quotes included.
std::string json_quote(const std::string& s);

}  // namespace detail
}  // namespace ddp
