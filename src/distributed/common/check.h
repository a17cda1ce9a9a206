#pragma once

// DDP_CHECK(cond, parts...): TORCH_CHECK's contract for ddp-cpp's own checks (a c10::Error
// whose message is c10::str(parts...)), but the message is all there is: no "Exception
// raised from <function> at <file>:<line> (most recent call first)" and no backtrace
// after it, so what the user reads ends with the explanation. Invariants keep
// TORCH_INTERNAL_ASSERT, whose location is useful to us.

#include <c10/macros/Macros.h>
#include <c10/util/StringUtil.h>

#include <string>

namespace ddp {
namespace detail {

/// Throws c10::Error carrying `message` and no backtrace.
[[noreturn]] void throw_error(std::string message);

/// `s` with ASCII letters in lower case (option values, error texts we classify).
std::string ascii_lower(std::string s);

}  // namespace detail
}  // namespace ddp

#define DDP_CHECK(cond, ...)                               \
  do {                                                     \
    if (C10_UNLIKELY(!(cond))) {                           \
      ::ddp::detail::throw_error(::c10::str(__VA_ARGS__)); \
    }                                                      \
  } while (false)
