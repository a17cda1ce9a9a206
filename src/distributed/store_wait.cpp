#include "distributed/store_wait.h"

#include "distributed/comm.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <thread>

namespace ddp {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

WaitReport parse_wait_report(const std::optional<std::string>& text) {
  WaitReport t;
  if (!text) return t;
  int first = 0, every = 0;
  char comma = 0;
  std::istringstream in(*text);
  if (in >> first >> comma >> every && comma == ',' && first >= 0 && every > 0) {
    t.first = std::chrono::seconds(first);
    t.every = std::chrono::seconds(every);
  }
  return t;
}

KeyWait wait_for_keys(
    const TryGet& try_get, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
    const WaitReport& times,
    const std::function<std::string(const std::vector<size_t>&, std::chrono::seconds)>& report) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto next_report = start + times.first;
  auto pause = std::chrono::microseconds(200);

  KeyWait result;
  result.values.assign(keys.size(), std::nullopt);
  for (;;) {
    result.missing.clear();
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!result.values[i]) result.values[i] = try_get(keys[i]);
      if (!result.values[i]) result.missing.push_back(i);
    }
    if (result.missing.empty()) return result;
    const auto now = Clock::now();
    if (now >= deadline) return result;
    if (now >= next_report) {
      const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - start);
      std::fprintf(stderr, "%s\n", report(result.missing, waited).c_str());
      std::fflush(stderr);
      next_report = now + times.every;
    }
    std::this_thread::sleep_for(std::min<std::chrono::microseconds>(
        pause, std::chrono::duration_cast<std::chrono::microseconds>(deadline - now)));
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(50));
  }
}

TryGet store_reader(Comm& comm) {
  return [&comm](const std::string& key) { return comm.store_try_get(key); };
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) os << (i + 1 == ranks.size() ? " and " : ", ");
    os << ranks[i];
  }
  return os.str();
}

}  // namespace detail
}  // namespace ddp
