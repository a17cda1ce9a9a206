#pragma once

// Uneven inputs: ranks that run out of batches before the others keep the others going.
//
// Without it, the rank that finishes first leaves its peers blocked in their next
// all-reduce until the timeout. Inside ddp::join, a rank that has left its loop body
// shadows the collectives of the ranks still training (it contributes zeros to every
// gradient bucket, follows the bucket rebuild, the unused-parameter counts and the
// buffer broadcast) until every rank is out; then every rank takes the parameters and
// buffers of a rank that trained to the end. This is torch.distributed.algorithms.Join
// with DDP's join hook; see docs/join.md.
//
// Example:
//   auto dmodel = ddp::DistributedDataParallel(model, options);
//   dmodel->join([&] {
//     for (const auto& batch : my_batches) {   // any number of batches per rank
//       optimizer.zero_grad();
//       loss_fn(dmodel(batch.data), batch.target).backward();
//       optimizer.step();
//     }
//   });
//   // every rank now holds the same parameters
//
// With options:
//   ddp::join({dmodel.get()}, body, ddp::JoinOptions().divide_by_initial_world_size(false));

#include <ddp/distributed/process_group.h>

#include <torch/arg.h>

#include <functional>
#include <memory>
#include <vector>

namespace ddp {

/// How ddp::join treats ranks that run out of inputs. Names and defaults are PyTorch's.
///
/// Example:
///   ddp::JoinOptions().throw_on_early_termination(true)
struct JoinOptions {
  /// false: join() just runs the body (every rank must then have as many batches).
  TORCH_ARG(bool, enable) = true;
  /// true: as soon as one rank runs out, every rank raises EarlyTerminationError (at its
  /// next forward, or at once for the rank that ran out) instead of shadowing.
  TORCH_ARG(bool, throw_on_early_termination) = false;
  /// true: gradients are averaged over the initial world size, also when fewer ranks
  /// still train (joined ranks count as zeros). false: over the ranks still training.
  TORCH_ARG(bool, divide_by_initial_world_size) = true;
};

namespace detail {
class JoinContext;
}  // namespace detail

/// What the ranks still training announced at the start of one of their forwards.
struct JoinRound {
  /// Ranks still training, ascending (never empty while shadowing).
  std::vector<int> active_ranks;
  /// Whether that forward's backward is reduced (false under no_sync).
  bool sync = false;
};

/// A participant of ddp::join: DistributedDataParallel, and anything else whose
/// training step runs collectives. The first participant announces this rank's
/// forwards to the others while it trains; once it is out of inputs, every
/// participant shadows one training iteration per round.
class Joinable {
 public:
  virtual ~Joinable() = default;
  /// The group of this participant's collectives (the same for all participants).
  virtual ProcessGroup& join_process_group() const = 0;
  /// The scope begins. `notifier`: this participant announces the forwards.
  virtual void join_enter(std::shared_ptr<detail::JoinContext> context, bool notifier) = 0;
  /// The scope ends (also when an exception leaves it).
  virtual void join_leave() noexcept = 0;
  /// This rank is out of inputs: issue the collectives of one iteration of the ranks
  /// still training, contributing nothing.
  virtual void join_shadow(const JoinRound& round) = 0;
  /// Every rank is out: take the state of rank `src`, which trained to the end.
  virtual void join_finish(int src) = 0;
};

/// Runs `body` (this rank's training loop), then shadows the ranks still training
/// until every rank has left its body, then makes every participant's state equal on
/// all ranks. Collective: every rank of the group calls it with the same participants
/// and options. An exception from `body` propagates at once (nothing is shadowed).
void join(const std::vector<Joinable*>& participants, const std::function<void()>& body,
          const JoinOptions& options = JoinOptions());

}  // namespace ddp
