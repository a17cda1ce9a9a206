#pragma once

// The exchange behind ddp::join (see docs/join.md).
//
// Note [Join rounds]
// Every forward that records gradients on a rank still training starts with one small
// all-reduce, a "round", of 3 * world_size integers: per rank, whether it still trains,
// whether it ran out under throw_on_early_termination, and whether its forward is
// reduced in backward. A rank out of inputs takes part in the same all-reduce with
// zeros (or its throw flag), so every rank reads the same answer:
//   - nobody trains any more: the loop ends, the last joiners' state wins;
//   - a rank threw: every rank raises EarlyTerminationError;
//   - else the joined ranks issue what that iteration of the trainers issues, in the
//     same order: the bucket rebuild (once), the buffer broadcast (from the lowest rank
//     still training), and, if the forward is reduced, one all-reduce per gradient
//     bucket (zeros) and the unused-parameter counts.
// Trainers that disagree about no_sync would issue different collectives; the round
// shows it and every rank raises MismatchError instead.

#include <ddp/algorithms/join.h>
#include <ddp/distributed/process_group.h>

#include <cstdint>

namespace ddp {
namespace detail {

class JoinContext {
 public:
  JoinContext(ProcessGroup& pg, JoinOptions options);

  const JoinOptions& options() const { return options_; }
  ProcessGroup& process_group() const { return pg_; }

  /// A rank still training, at each forward that records gradients. `sync`: that
  /// forward's backward is reduced. Throws EarlyTerminationError when a rank ran out
  /// under throw_on_early_termination.
  JoinRound notify(bool sync);
  /// A rank out of inputs: one round. Empty active_ranks: everyone is out.
  JoinRound joined_round();
  /// After the last round: the highest rank that never shadowed (it trained to the end).
  int final_source(bool last_joiner);

 private:
  JoinRound exchange(bool active, bool sync, bool threw);

  ProcessGroup& pg_;
  const JoinOptions options_;
  int64_t rounds_ = 0;
};

/// How many ddp::join bodies this thread is inside.
///
/// Note [No fully_shard inside join]
/// A rank out of inputs shadows the others' collectives for DDP (an all-reduce of
/// zeros). A sharded model's step needs the rank's own rows in every all-gather and its
/// own reduce-scatter, which a rank that stopped training cannot stand in for; FSDP2
/// has no Join either. So a unit's forward inside a join body is refused, on every rank
/// alike, before any collective.
int& join_body_depth();

}  // namespace detail
}  // namespace ddp
