#pragma once

// Waiting on the rendezvous store for keys that other ranks set, with a timeout and a
// report of who is still missing: the rendezvous, monitored_barrier and the collective
// fingerprints all wait this way, so that a rank that never comes is named instead of
// leaving the others silent.

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ddp {
namespace detail {

class Comm;

/// How to read keys: a Comm's store, or a store before its Comm exists.
using TryGet = std::function<std::optional<std::string>(const std::string& key)>;

struct KeyWait {
  std::vector<std::optional<std::string>> values;  // per key; nullopt: never came
  std::vector<size_t> missing;                     // indices of the keys that never came
  bool complete() const { return missing.empty(); }
};

/// When a wait reports who is missing: first after `first`, then every `every`.
struct WaitReport {
  std::chrono::seconds first{10};
  std::chrono::seconds every{30};
};

/// DDP_WAIT_REPORT's value "first,every" (seconds), for tests and impatient users; the
/// defaults when unset or malformed. Read once, into CommConfig::wait_report.
WaitReport parse_wait_report(const std::optional<std::string>& text);

/// Note [Waiting that talks]
/// Polls until every key exists or `timeout` passes. While waiting, after when.first
/// and then at most every when.every, prints one line to stderr:
/// `report(missing, waited)`.
KeyWait wait_for_keys(const TryGet& try_get, const std::vector<std::string>& keys,
                      std::chrono::milliseconds timeout, const WaitReport& when,
                      const std::function<std::string(const std::vector<size_t>& missing,
                                                      std::chrono::seconds waited)>& report);

/// Store access through `comm`.
TryGet store_reader(Comm& comm);

/// "1, 3 and 4"
std::string join_ranks(const std::vector<int>& ranks);

}  // namespace detail
}  // namespace ddp
