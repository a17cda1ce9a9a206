#include <ddp/algorithms/join.h>

#include <ddp/errors.h>

#include "distributed/common/check.h"
#include "distributed/comm.h"
#include "algorithms/join_context.h"

#include <ATen/ATen.h>

#include <exception>

namespace ddp {
namespace detail {
namespace {

std::string on_rank(const ProcessGroup& pg) {
  return "on rank " + std::to_string(pg.rank()) + " of " + std::to_string(pg.size());
}

}  // namespace

JoinContext::JoinContext(ProcessGroup& pg, JoinOptions options) : pg_(pg), options_(options) {}

// See Note [Join rounds].
JoinRound JoinContext::exchange(bool active, bool sync, bool threw) {
  const int world = pg_.size();
  const int rank = pg_.rank();
  at::Tensor mine = at::zeros({3 * static_cast<int64_t>(world)}, at::kLong);
  int64_t* m = mine.data_ptr<int64_t>();
  m[rank] = active ? 1 : 0;
  m[world + rank] = threw ? 1 : 0;
  m[2 * world + rank] = active && sync ? 1 : 0;
  const at::Tensor all = all_reduce_host(pg_, mine, ReduceOp::SUM);
  const int64_t* a = all.data_ptr<int64_t>();
  ++rounds_;

  JoinRound round;
  std::vector<int> threw_ranks, synced, unsynced;
  for (int r = 0; r < world; ++r) {
    if (a[world + r] != 0) threw_ranks.push_back(r);
    if (a[r] == 0) continue;
    round.active_ranks.push_back(r);
    (a[2 * world + r] != 0 ? synced : unsynced).push_back(r);
  }
  if (!threw_ranks.empty() && !round.active_ranks.empty()) {
    throw EarlyTerminationError(
        "ddp::join " + on_rank(pg_) + ": rank(s) " + join_ranks(threw_ranks) +
        " ran out of inputs while rank(s) " + join_ranks(round.active_ranks) +
        " still had some (round " + std::to_string(rounds_) +
        "). With "
        "JoinOptions::throw_on_early_termination every rank raises here; use the default "
        "(false) to let the ranks that ran out shadow the others instead.");
  }
  if (!synced.empty() && !unsynced.empty()) {
    throw MismatchError("ddp::join " + on_rank(pg_) + ": in round " + std::to_string(rounds_) +
                        ", rank(s) " + join_ranks(synced) +
                        " ran a forward whose backward is reduced while rank(s) " +
                        join_ranks(unsynced) +
                        " ran one under no_sync(). Every rank still training must "
                        "use no_sync() for the same forwards.");
  }
  round.sync = !synced.empty();
  return round;
}

JoinRound JoinContext::notify(bool sync) { return exchange(/*active=*/true, sync, false); }

JoinRound JoinContext::joined_round() {
  return exchange(/*active=*/false, false, options_.throw_on_early_termination());
}

int JoinContext::final_source(bool last_joiner) {
  at::Tensor mine = at::full({1}, last_joiner ? pg_.rank() : -1, at::kLong);
  const int64_t src = all_reduce_host(pg_, mine, ReduceOp::MAX).item<int64_t>();
  TORCH_INTERNAL_ASSERT(src >= 0 && src < pg_.size(), "ddp::join: no rank trained to the end");
  return static_cast<int>(src);
}

}  // namespace detail

namespace detail {
int& join_body_depth() {
  thread_local int depth = 0;
  return depth;
}
}  // namespace detail

void join(const std::vector<Joinable*>& participants, const std::function<void()>& body,
          const JoinOptions& options) {
  DDP_CHECK(!participants.empty(), "ddp::join needs at least one participant (a "
                                   "DistributedDataParallel model), but got none.");
  for (size_t i = 0; i < participants.size(); ++i) {
    DDP_CHECK(participants[i] != nullptr, "ddp::join: participant #", i, " is null.");
  }
  DDP_CHECK(body, "ddp::join: the loop body is empty.");
  if (!options.enable()) {
    body();
    return;
  }
  ProcessGroup& pg = participants[0]->join_process_group();
  for (size_t i = 1; i < participants.size(); ++i) {
    DDP_CHECK(&participants[i]->join_process_group() == &pg, "ddp::join ", detail::on_rank(pg),
              ": participant #", i,
              " runs on another process group "
              "than participant #0; all participants of one join must share a group.");
  }

  auto context = std::make_shared<detail::JoinContext>(pg, options);
  size_t entered = 0;
  struct Leave {
    const std::vector<Joinable*>& participants;
    const size_t& entered;
    ~Leave() {
      for (size_t i = 0; i < entered; ++i) participants[i]->join_leave();
    }
  } leave{participants, entered};
  for (; entered < participants.size(); ++entered) {
    participants[entered]->join_enter(context, /*notifier=*/entered == 0);
  }

  {
    // Note [No fully_shard inside join]: fully_shard's units ask whether they run here.
    struct InBody {
      InBody() { ++detail::join_body_depth(); }
      ~InBody() { --detail::join_body_depth(); }
    } in_body;
    body();
  }

  // This rank is out of inputs: shadow the others until nobody trains.
  bool last_joiner = true;
  for (;;) {
    const JoinRound round = context->joined_round();
    if (round.active_ranks.empty()) break;
    last_joiner = false;
    for (Joinable* p : participants) p->join_shadow(round);
  }
  const int src = context->final_source(last_joiner);
  for (Joinable* p : participants) p->join_finish(src);
}

}  // namespace ddp
