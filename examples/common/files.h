#pragma once

// What the examples' run folders need from files: JSON-lines records read with a message
// that names the line and says what to do when one is damaged, files replaced atomically,
// and tick steps for their SVG plots.

#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>
#include <string>

namespace examples {

/// Calls `parse` with each non-empty line of `path` as JSON; a missing file is no lines.
/// A line that is not JSON, or that `parse` rejects (a missing or mistyped field), throws
/// std::runtime_error naming path:line, the `fields` expected, the start of the line, and
/// what to do.
void read_json_lines(const std::string& path, const std::string& fields,
                     const std::function<void(const nlohmann::json&)>& parse);

/// Replaces `path` with `text`: written to a temporary file, then renamed over it, so a
/// kill at any moment leaves the old file or the new one.
void write_file_atomically(const std::string& path, const std::string& text);

/// A tick step of 1, 2 or 5 times a power of ten giving about `ticks` intervals.
inline double nice_step(double range, int ticks) {
  const double raw = range / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / power;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * power;
}

}  // namespace examples
