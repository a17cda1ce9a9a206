#pragma once

// The reducer: turns "parameter i's gradient is ready" events into bucketed, ordered,
// overlapped all-reduces, and writes the averages back at the end of backward. It owns
// every decision about synchronisation: whether a forward's backward is reduced
// (no_sync, world size 1), which parameters count as used, and when an iteration ends.
//
// Contract, per iteration:
//   before_forward()             the previous reduction must have finished
//   rebuild_if_due()             once, after the first reduced iteration (collective)
//   after_forward(outputs, ...)  arm for one reduced backward (or local accumulation)
//   on_grad_ready(i)             from parameter i's accumulator hook, during backward
//   finalize_backward()          from the engine, once, when the outermost backward ends
//
// Note [Iteration phases]
//   kIdle --synced forward--> kArmed --first gradient--> kReducing --last gradient,
//     |                         |  ^                          |      end of backward--> kIdle
//     |                         |  +-- forward under no_sync  +--(gradients missing: stays)
//     +--forward under no_sync--+--> kLocal (hooks only record use; gradients stay local)
//   any phase --a bucket's reduction failed--> kFailed (for good: the group is broken)
// A forward under no_sync() after a synced one leaves the reducer armed: one backward
// through both outputs is reduced, as in PyTorch (the synced forward asked for it). A
// gradient arriving in kIdle is a backward without its forward; a forward that finds
// the reducer still in kReducing (a backward that left parameters without gradient, or
// that threw) names the parameters that got none; any use in kFailed reports the
// failure. Errors are raised where
// the user can act on them and never by waiting: no phase waits for a peer except for
// collectives every rank issues alike.
//
// Note [End-of-backward callback]
// finalize_backward must run once, after every gradient of the backward has arrived.
// The autograd engine runs callbacks queued with Engine::queue_callback when the graph
// task that is current at queueing time ends. With reentrant backward (activation
// checkpointing whose backward calls backward), accumulator hooks also fire inside
// nested graph tasks, which end long before the outer one, so a callback queued by the
// first gradient could run before the others exist. As in PyTorch, it is therefore
// queued when the *last* parameter becomes ready (after its last expected arrival with
// static_graph): every gradient exists by then, whichever graph task ends first. With
// nothing to wait for or write back (world size 1, default hook) the iteration ends in
// that hook instead, without a callback. The first static_graph iteration counts
// arrivals and cannot know the last one, so it queues the callback from a pre-hook on
// the grad_fn of each output of the synced forward: that node runs first, in the
// outermost backward (PyTorch uses an identity node on the outputs to the same end).
// Only when no output has a grad_fn is it queued by the first gradient hook instead.
// A backward that leaves parameters without gradient never queues the callback; the
// next forward finds the reducer still reducing and names them, and no rank waits for
// buckets that a peer missing other parameters never launches. An output's pre-hook
// holds a weak_ptr, so a retained graph backwarded after the reducer is gone does
// nothing. The callback holds a plain pointer: the engine runs it before the backward
// that queued it returns, and the reducer is not destroyed inside its own backward.

#include <ddp/parallel/comm_hooks.h>
#include <ddp/parallel/iteration_stats.h>
#include <ddp/distributed/process_group.h>

#include "parallel/bucket.h"
#include "parallel/bucket_assignment.h"
#include "parallel/grad_hooks.h"
#include "parallel/trace_writer.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ddp {
namespace detail {

struct ReducerOptions {
  size_t first_bucket_cap_bytes = 1024 * 1024;
  size_t bucket_cap_bytes = 25 * 1024 * 1024;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool static_graph = false;
};

/// Whether buckets are rebuilt from the real gradient order after the first iteration
/// (and start as one bucket), as in PyTorch: not when the graph may change from
/// iteration to iteration (find_unused_parameters without static_graph).
inline bool rebuilds_buckets(const ReducerOptions& o) {
  return o.static_graph || !o.find_unused_parameters;
}

class Reducer final : public OutputListener {
 public:
  /// params: leaves that require grad, each once; names: theirs, for messages.
  static std::shared_ptr<Reducer> create(std::vector<at::Tensor> params,
                                         std::vector<std::string> names,
                                         std::shared_ptr<ProcessGroup> pg, ReducerOptions options,
                                         std::shared_ptr<TraceWriter> trace);
  ~Reducer();

  // ---- synchronisation ----
  /// no_sync() nests: forwards run while the depth is above zero are not reduced.
  void enter_no_sync();
  void exit_no_sync();

  // ---- forward side ----
  /// Returns whether after_forward wants the forward's output tensors (to find unused
  /// parameters, or the end of the first static_graph backward).
  bool before_forward();
  /// `outputs`: the forward's output tensors; `unknown_output_type`: the name of an
  /// output type DDP cannot search for tensors, or nullptr.
  void after_forward(const std::vector<at::Tensor>& outputs, const char* unknown_output_type);

  /// Rebuilds the buckets from the first reduced iteration's gradient order, once, at
  /// the first forward after it (a broadcast from rank 0; see docs/ddp.md).
  void rebuild_if_due();

  // ---- uneven inputs (ddp::join; reducer_join.cpp) ----
  /// A rank still training, before a forward that records gradients: whether its
  /// backward will be reduced. Throws if a reduced forward still awaits its backward.
  bool join_forward_syncs();
  /// Divide the next reductions by `divisor` instead of the world size (default hook).
  void set_divisor(int divisor);
  /// This rank is out of inputs: checks that no backward is pending and clears what
  /// the last (no_sync) iterations recorded.
  void begin_shadowing();
  /// The collectives of one reduced iteration of the ranks still training, with zeros.
  void shadow_reduction();

  // ---- backward side ----
  void on_grad_ready(size_t index);
  void on_output_grad(uint64_t forward_id) override;
  void finalize_backward();

  // ---- configuration and queries ----
  void register_comm_hook(std::shared_ptr<CommHook> hook);
  BucketAssignment bucket_indices() const;
  IterationStats last_stats() const;

 private:
  enum class Phase { kIdle, kArmed, kLocal, kReducing, kFailed };

  /// Everything that lives for one iteration, reset as one (reset_iteration).
  struct Iteration {
    Phase phase = Phase::kIdle;
    uint64_t forward_id = 0;       // which synced forward armed it (output pre-hooks)
    bool callback_queued = false;  // finalize_backward is queued on the engine
    std::vector<bool> ready;
    std::vector<bool> unused;        // marked ready with zero contribution
    std::vector<bool> locally_used;  // a defined gradient arrived (also under no_sync)
    std::vector<int> hook_calls;     // static_graph: gradient arrivals per parameter
    size_t next_bucket = 0;
    size_t num_ready = 0;
    bool raised = false;  // a gradient hook of this backward threw
    int64_t forward_end_ns = 0;
  };

  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
          std::shared_ptr<ProcessGroup> pg, ReducerOptions options,
          std::shared_ptr<TraceWriter> trace);

  // reducer.cpp
  /// World size 1 with the default hook: nothing to exchange, so gradients stay where
  /// the engine put them (no bucket copies); every check still runs.
  bool local() const { return trivial_ && !custom_hook_; }
  void check_parameters_unchanged() const;
  void grad_ready(size_t index);
  void all_ready();
  void finalize_locked();
  void queue_finalize();
  void begin_backward();
  void mark_ready(size_t index);
  void launch(size_t bucket);
  /// Starts bucket b's reduction of `buffer` (its own, or zeros when shadowing).
  c10::intrusive_ptr<c10::ivalue::Future> reduce_async(size_t b, at::Tensor buffer);

  // reducer_in_place.cpp (Note [Gradients reduced in place])
  /// Whether the bucket of these parameters is reduced in place: the same answer on
  /// every rank.
  bool reduces_in_place(const std::vector<size_t>& bucket_params) const;
  /// What bucket's reduction takes: each gradient, or its stand-in in the buffer.
  std::vector<at::Tensor> in_place_inputs(Bucket& bucket);
  /// The stand-ins of a bucket reduced in place (its views), made on first use.
  const std::vector<at::Tensor>& stand_ins(Bucket& bucket);
  c10::intrusive_ptr<c10::ivalue::Future> reduce_in_place_async(std::vector<at::Tensor> tensors);
  void set_divisor_locked(int divisor);
  bool prescaled() const { return !custom_hook_; }
  void maybe_rebuild_buckets();
  void install_buckets(const BucketAssignment& assignment);
  bool records_ready_order() const;
  bool static_first_iteration() const { return options_.static_graph && num_reduced_ == 0; }

  // reducer_finalize.cpp
  /// Per parameter, whether any rank produced its gradient: exact counts, or 1 for
  /// every parameter when this rank used them all (Note [Lazy use counts]); empty
  /// when nothing needs it.
  std::vector<int> global_use();
  /// Waits for every launched bucket; with `use`, writes each one back as soon as it
  /// is reduced (see Note [Write-back per bucket]).
  void wait_for_buckets(IterationStats& stats, const std::vector<int>* use);
  /// Bucket b's reduced buffer from its completed future; a failure moves the reducer
  /// to kFailed and throws.
  at::Tensor bucket_result(size_t b, c10::ivalue::Future& future);
  /// Throws, moving the reducer to kFailed, when bucket b's future failed.
  void bucket_failure(size_t b, c10::ivalue::Future& future);
  /// After a reduced iteration (real or shadowed): counts it, keeps what static_graph
  /// learnt from the first one.
  void end_reduced_iteration(const std::vector<int>& use);
  void write_back(const Bucket& bucket, const std::vector<int>& global_use);
  void reset_iteration();
  /// What an iteration's stats and trace need once its device events are done (Note
  /// [Device time]).
  struct TimedIteration {
    int64_t forward_end_ns = 0, finalize_start_ns = 0, wait_start_ns = 0, wait_end_ns = 0;
    std::shared_ptr<DeviceEvent> wait_start;  // null: timed on the host, already known
    std::vector<std::shared_ptr<BucketTiming>> timings;
    std::vector<int64_t> bytes;
    std::vector<size_t> params;
  };
  /// Completes last_stats_ (and writes the trace) for the last reduced iteration.
  void resolve_device_times() const;
  void record_trace(const IterationStats& stats, const TimedIteration& timed) const;

  // reducer_errors.cpp
  std::string where() const;
  std::string quoted_names(const std::vector<size_t>& indices) const;
  void check_usable() const;
  [[noreturn]] void fail_unfinished() const;
  [[noreturn]] void fail_failed() const;
  [[noreturn]] void fail_backward_without_forward(size_t index) const;
  [[noreturn]] void fail_ready_twice(size_t index) const;
  [[noreturn]] void fail_static_graph_changed(size_t index, int calls) const;
  [[noreturn]] void fail_parameter_changed(size_t index) const;
  [[noreturn]] void fail_unknown_output(const char* type) const;
  /// Debug mode: the rebuilt bucket assignment is the same on every rank.
  void check_buckets_agree();

  // Fixed at construction.
  std::weak_ptr<Reducer> self_;
  const std::vector<at::Tensor> params_;
  const std::vector<std::string> names_;
  const std::shared_ptr<ProcessGroup> pg_;
  const int world_size_;
  const bool trivial_;  // the group's collectives do nothing (Comm::trivial)
  const ReducerOptions options_;
  const std::shared_ptr<TraceWriter> trace_;
  std::vector<ParamSpec> specs_;
  std::unique_ptr<GradHooks> hooks_;
  // What the default hook divides by (see Note [Pre-scaled buckets]): the world size,
  // or under ddp::join the ranks still training; inverse_divisor_ is 0-dim 1/divisor_.
  int divisor_ = 1;
  at::Tensor inverse_divisor_;

  mutable std::mutex mutex_;
  std::shared_ptr<CommHook> comm_hook_;
  bool custom_hook_ = false;
  int no_sync_depth_ = 0;

  // Buckets (replaced once by the rebuild). Buffers exist only when !local().
  BucketAssignment assignment_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
  bool rebuilt_ = false;
  std::vector<size_t> ready_order_;  // first reduced iteration, for the rebuild

  Iteration iter_;

  // Across iterations.
  uint64_t forwards_ = 0;
  int64_t num_reduced_ = 0;
  std::vector<int> expected_calls_;  // static_graph: from the first iteration
  std::vector<int> static_global_use_;
  Work unread_use_;      // Note [Lazy use counts]: the last all-reduce nobody had to read
  std::string failure_;  // kFailed: what failed
  mutable IterationStats last_stats_;
  mutable std::optional<TimedIteration> pending_;
};

}  // namespace detail
}  // namespace ddp
