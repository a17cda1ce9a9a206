// monitored_barrier: a barrier over the rendezvous store that names the late ranks.
//
// Barrier n uses ddp/mb/<n>/<rank> (rank r arrived) and ddp/mb/<n>/verdict (rank 0's
// answer: "ok", or the late ranks). Rank 0 waits up to the timeout for every arrival,
// then writes the verdict; the others wait for the verdict a little longer than rank 0
// waits, so that they report rank 0's finding rather than their own guess. Through
// the store rather than the backend, it still answers while a backend collective hangs.

#include <ddp/errors.h>
#include <ddp/distributed/process_group.h>

#include "distributed/common/check.h"
#include "distributed/comm.h"
#include "distributed/store_wait.h"

#include <sstream>

namespace ddp {
namespace {

constexpr auto kVerdictGrace = std::chrono::seconds(5);

std::string key(uint64_t n, const std::string& what) {
  return "ddp/mb/" + std::to_string(n) + "/" + what;
}

std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> ranks;
  std::istringstream in(text);
  int r = 0;
  while (in >> r) ranks.push_back(r);
  return ranks;
}

}  // namespace

void ProcessGroup::monitored_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks) {
  (void)wait_all_ranks;  // every late rank is always named: the store shows them all at once
  DDP_CHECK(timeout.count() > 0, "monitored_barrier timeout must be > 0 ms, but got ",
            timeout.count(), " (rank ", rank(), ")");
  detail::Comm& c = comm();
  const uint64_t n = c.next_monitored_barrier();
  const int me = rank();
  const std::string where = "monitored_barrier #" + std::to_string(n) + " on rank " +
                            std::to_string(me) + " of " + std::to_string(size());
  const std::string limit = std::to_string(timeout.count()) + " ms";

  if (me != 0) {
    c.store_set(key(n, std::to_string(me)), "1");
    const auto got =
        detail::wait_for_keys(detail::store_reader(c), {key(n, "verdict")}, timeout + kVerdictGrace,
                              c.config().wait_report,
                              [&](const std::vector<size_t>&, std::chrono::seconds waited) {
                                return "[ddp] " + where + ": has waited " +
                                       std::to_string(waited.count()) +
                                       " s for rank 0 to see every rank arrive (timeout " + limit +
                                       ")";
                              });
    if (!got.complete()) {
      throw TimeoutError(where + ": rank 0 did not answer within " + limit + " (+" +
                         std::to_string(kVerdictGrace.count()) +
                         " s): rank 0 is stuck "
                         "before this barrier, or gone.");
    }
    const std::string verdict = *got.values[0];
    if (verdict == "ok") return;
    throw TimeoutError(where + ": rank(s) " + detail::join_ranks(parse_ranks(verdict)) +
                       " did not arrive within " + limit +
                       " (seen by rank 0). They are "
                       "stuck before this barrier, or gone.");
  }

  std::vector<std::string> keys;
  for (int r = 1; r < size(); ++r) keys.push_back(key(n, std::to_string(r)));
  const auto got =
      detail::wait_for_keys(detail::store_reader(c), keys, timeout, c.config().wait_report,
                            [&](const std::vector<size_t>& missing, std::chrono::seconds waited) {
                              std::vector<int> ranks;
                              for (size_t i : missing) ranks.push_back(static_cast<int>(i) + 1);
                              return "[ddp] " + where + ": has waited " +
                                     std::to_string(waited.count()) + " s for rank(s) " +
                                     detail::join_ranks(ranks) + " (timeout " + limit + ")";
                            });
  std::vector<int> late;
  std::string verdict;
  for (size_t i : got.missing) {
    late.push_back(static_cast<int>(i) + 1);
    verdict += std::to_string(i + 1) + " ";
  }
  c.store_set(key(n, "verdict"), late.empty() ? "ok" : verdict);
  if (late.empty()) return;
  throw TimeoutError(where + ": rank(s) " + detail::join_ranks(late) + " did not arrive within " +
                     limit +
                     ". They are stuck before this "
                     "barrier, or gone.");
}

void monitored_barrier() {
  const auto pg = default_group();
  pg->monitored_barrier(pg->timeout());
}

void monitored_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks) {
  default_group()->monitored_barrier(timeout, wait_all_ranks);
}

}  // namespace ddp
