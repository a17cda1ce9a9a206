#include "distributed/common/check.h"

#include <c10/util/Exception.h>

#include <cctype>

namespace ddp {
namespace detail {

void throw_error(std::string message) {
  // The base constructor without a backtrace: an empty one in LibTorch 1.13 (a
  // std::string), none in 2.x (a lazily computed one that is null).
  throw c10::Error(std::move(message), {});
}

std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace detail
}  // namespace ddp
