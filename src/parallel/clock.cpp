#include "parallel/clock.h"

#include <chrono>

namespace ddp {
namespace detail {

int64_t steady_now_ns() {
  using namespace std::chrono;
  return duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count();
}

int64_t trace_us(int64_t steady_ns) {
  using namespace std::chrono;
  static const int64_t offset_us =
      duration_cast<microseconds>(system_clock::now().time_since_epoch()).count() -
      steady_now_ns() / 1000;
  return steady_ns / 1000 + offset_us;
}

}  // namespace detail
}  // namespace ddp
