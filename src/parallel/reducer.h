#pragma once

// The reducer: turns "parameter i's gradient is ready" events into bucketed, ordered,
// overlapped all-reduces, and writes the averages back at the end of backward.
//
// Contract, per iteration:
//   before_forward()          the previous reduction must have finished; rebuild once
//   after_forward(out, sync)  arm for one reduced backward (or local accumulation)
//   on_grad_ready(i)          from parameter i's accumulator hook, during backward
//   finalize_backward()       from the engine, once, when backward ends
//
// Note [Iteration phases]
//   kIdle --forward--> kArmed --first gradient--> kReducing --end of backward--> kIdle
//                        |                             |
//                        |                             +--(gradients missing)--> kUnfinished
//   forward under no_sync --> kLocal (hooks only record use; gradients stay local)
// A gradient arriving in kIdle is a backward without its forward; any forward in
// kUnfinished (or in kReducing, after a backward that threw) reports the parameters
// that got no gradient. Errors are raised where the user can act on them and never by
// waiting: no phase waits for a peer except for collectives every rank issues alike.
//
// Note [End-of-backward callback]
// The first gradient of an iteration queues finalize_backward on the autograd engine
// (Engine::queue_callback); the engine runs it on the backward thread after the whole
// graph has executed, i.e. after every accumulator hook. It waits for the launched
// buckets, writes the averages back and resets. The callback holds a weak_ptr, so a
// reducer destroyed meanwhile turns it into a no-op.

#include <ddp/comm_hooks.h>
#include <ddp/iteration_stats.h>
#include <ddp/process_group.h>

#include "parallel/bucket.h"
#include "parallel/bucket_assignment.h"
#include "parallel/grad_hooks.h"
#include "parallel/trace_writer.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
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

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  /// params: leaves that require grad, each once; names: theirs, for messages.
  static std::shared_ptr<Reducer> create(std::vector<at::Tensor> params,
                                         std::vector<std::string> names,
                                         std::shared_ptr<ProcessGroup> pg,
                                         ReducerOptions options,
                                         std::shared_ptr<TraceWriter> trace);
  ~Reducer();

  // ---- forward side ----
  void before_forward();
  /// Whether after_forward wants the forward's output tensors (to find unused ones).
  bool needs_outputs() const;
  void after_forward(const std::vector<at::Tensor>& outputs, bool sync);

  // ---- backward side ----
  void on_grad_ready(size_t index);
  void finalize_backward();

  // ---- configuration and queries ----
  void register_comm_hook(std::shared_ptr<CommHook> hook);
  BucketAssignment bucket_indices() const;
  IterationStats last_stats() const;

 private:
  enum class Phase { kIdle, kArmed, kLocal, kReducing, kUnfinished };

  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
          std::shared_ptr<ProcessGroup> pg, ReducerOptions options,
          std::shared_ptr<TraceWriter> trace);

  // reducer.cpp
  void begin_backward();
  void mark_ready(size_t index);
  void launch(size_t bucket);
  bool prescaled() const { return !custom_hook_; }
  void maybe_rebuild_buckets();
  void install_buckets(const BucketAssignment& assignment);
  bool records_ready_order() const;
  bool static_first_iteration() const { return options_.static_graph && num_reduced_ == 0; }

  // reducer_finalize.cpp
  std::vector<int> global_use();
  /// Waits for every launched bucket; with `use`, writes each one back as soon as it
  /// is reduced (see Note [Write-back per bucket]).
  void wait_for_buckets(IterationStats& stats, const std::vector<int>* use);
  void write_back(const Bucket& bucket, const std::vector<int>& global_use);
  void reset_iteration();
  void record_trace(const IterationStats& stats, int64_t finalize_start_ns,
                    int64_t wait_start_ns, int64_t wait_end_ns);

  // reducer_errors.cpp
  std::string where() const;
  std::string quoted_names(const std::vector<size_t>& indices) const;
  [[noreturn]] void fail_unfinished() const;
  [[noreturn]] void fail_backward_without_forward(size_t index) const;
  [[noreturn]] void fail_ready_twice(size_t index) const;
  [[noreturn]] void fail_static_graph_changed(size_t index, int calls) const;

  // Fixed at construction.
  const std::vector<at::Tensor> params_;
  const std::vector<std::string> names_;
  const std::shared_ptr<ProcessGroup> pg_;
  const ReducerOptions options_;
  const std::shared_ptr<TraceWriter> trace_;
  std::vector<ParamSpec> specs_;
  std::unique_ptr<GradHooks> hooks_;
  at::Tensor inverse_world_;  // 0-dim 1/world_size, see Note [Pre-scaled buckets]

  mutable std::mutex mutex_;
  std::shared_ptr<CommHook> comm_hook_;
  bool custom_hook_ = false;

  // Buckets (replaced once by the rebuild).
  BucketAssignment assignment_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
  bool rebuilt_ = false;
  std::vector<size_t> ready_order_;  // first reduced iteration, for the rebuild

  // This iteration.
  Phase phase_ = Phase::kIdle;
  std::vector<bool> ready_;
  std::vector<bool> unused_;       // marked ready with zero contribution
  std::vector<bool> locally_used_; // a gradient arrived (also under no_sync)
  std::vector<int> hook_calls_;    // static_graph: gradient arrivals per parameter
  size_t next_bucket_ = 0;
  int64_t forward_end_ns_ = 0;
  std::vector<size_t> missing_;    // kUnfinished: parameters without gradient

  // Across iterations.
  int64_t num_reduced_ = 0;
  std::vector<int> expected_calls_;  // static_graph: from the first iteration
  std::vector<int> static_global_use_;
  IterationStats last_stats_;
};

} // namespace detail
} // namespace ddp
