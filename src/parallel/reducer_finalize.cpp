// The end of backward: wait for the buckets, write the averages back, reset.
// See Note [End-of-backward callback] in reducer.h.

#include "parallel/reducer.h"
#include "distributed/common/check.h"

#include "distributed/comm.h"
#include "parallel/scaled_copy.h"

#include <ddp/errors.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

namespace ddp {
namespace detail {
namespace {

double ms_between(int64_t start_ns, int64_t end_ns) {
  return static_cast<double>(end_ns - start_ns) / 1e6;
}

}  // namespace

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  finalize_locked();
}

void Reducer::finalize_locked() {
  iter_.callback_queued = false;
  if (iter_.phase != Phase::kReducing) return;  // no gradient reached this backward
  const int64_t finalize_start_ns = steady_now_ns();
  resolve_device_times();  // the previous iteration's, if it was timed on a device

  IterationStats stats;
  stats.iteration = num_reduced_ + 1;
  stats.num_buckets = buckets_.size();
  stats.backward_ms = ms_between(iter_.forward_end_ns, finalize_start_ns);
  stats.buckets_launched_before_end = iter_.next_bucket;
  stats.buckets_reduced_in_place = static_cast<size_t>(
      std::count_if(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.in_place; }));
  for (size_t b = 0; b < iter_.next_bucket; ++b) {
    const Bucket& bucket = buckets_[b];
    stats.buckets_done_before_end +=
        bucket.future && bucket.timing->finished(*bucket.future) ? 1 : 0;
  }

  if (static_first_iteration()) {
    // All arrivals are counted; now reduce everything, in bucket order.
    expected_calls_ = iter_.hook_calls;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!iter_.ready[i]) mark_ready(i);
    }
  }

  if (iter_.num_ready != params_.size()) {
    // Gradients are missing: the next forward reports them (Note [Iteration phases]).
    // The buckets already launched are not waited for: a rank that missed other
    // gradients never launches them, and waiting would block until the timeout. Their
    // futures stay referenced (the reducer stays in kReducing), so their buffers
    // outlive the collectives.
    return;
  }

  // World size 1 with the default hook has nothing to wait for (and no clock to read).
  const bool local_only = local();
  const int64_t wait_start_ns = local_only ? finalize_start_ns : steady_now_ns();
  // Note [Device time]: where backward's stream reaches the end of backward.
  std::shared_ptr<DeviceEvent> wait_start =
      local_only || params_.empty() ? nullptr : DeviceEvent::record(params_.front().device());
  const std::vector<int> use = global_use();
  wait_for_buckets(stats, &use);
  const int64_t wait_end_ns = local_only ? wait_start_ns : steady_now_ns();
  stats.wait_ms = ms_between(wait_start_ns, wait_end_ns);
  end_reduced_iteration(use);
  TimedIteration timed;
  timed.forward_end_ns = iter_.forward_end_ns;
  timed.finalize_start_ns = finalize_start_ns;
  timed.wait_start_ns = wait_start_ns;
  timed.wait_end_ns = wait_end_ns;
  timed.wait_start = std::move(wait_start);
  for (const Bucket& bucket : buckets_) {
    timed.timings.push_back(bucket.timing);
    timed.bytes.push_back(bucket.bytes());
    timed.params.push_back(bucket.params.size());
  }
  reset_iteration();
  last_stats_ = stats;
  pending_ = std::move(timed);
  // On the CPU every time is known now; on a device the events are read when asked
  // for (last_stats) or at the next iteration's end, so that nothing waits for them.
  if (!pending_->wait_start) resolve_device_times();
}

void Reducer::resolve_device_times() const {
  if (!pending_) return;
  TimedIteration timed = std::move(*pending_);
  pending_.reset();
  IterationStats& stats = last_stats_;
  if (timed.wait_start) {
    stats.allreduce_total_ms = 0;
    stats.bucket_allreduce_ms.clear();
    double last_end_ms = 0;  // the latest bucket end, from the wait_start event
    for (const auto& timing : timed.timings) {
      if (timing->launch_ns.load() == 0 || !timing->start) continue;
      const double ms = timing->reduction_ms();
      timing->done_ns = timing->launch_ns.load() + static_cast<int64_t>(ms * 1e6);
      stats.bucket_allreduce_ms.push_back(ms);
      stats.allreduce_total_ms += ms;
      if (auto end = timing->end_event()) {
        last_end_ms = std::max(last_end_ms, end->ms_since(*timed.wait_start));
      }
    }
    // How long the end of backward waited on the device for communication.
    stats.wait_ms = last_end_ms;
    timed.wait_end_ns = timed.wait_start_ns + static_cast<int64_t>(last_end_ms * 1e6);
  }
  if (trace_) record_trace(stats, timed);
}

void Reducer::end_reduced_iteration(const std::vector<int>& use) {
  if (static_first_iteration()) static_global_use_ = use;
  ++num_reduced_;
}

std::vector<int> Reducer::global_use() {
  const bool needed = options_.find_unused_parameters || options_.static_graph;
  if (!needed) return {};
  if (options_.static_graph && !static_first_iteration() && !static_global_use_.empty()) {
    return static_global_use_;
  }
  // How many ranks produced a gradient for each parameter: one that no rank used
  // keeps its .grad() untouched instead of getting a zero.
  const int64_t n = static_cast<int64_t>(params_.size());
  at::Tensor counts = at::empty({n}, at::kInt);
  int* data = counts.data_ptr<int>();
  for (int64_t i = 0; i < n; ++i) data[i] = iter_.locally_used[i] ? 1 : 0;
  Comm& comm = comm_of(*pg_);
  std::vector<at::Tensor> on_device{comm.to_device(counts)};
  Work work = pg_->all_reduce_async(on_device, ReduceOp::SUM);
  // Note [Lazy use counts]: a parameter this rank used is used somewhere, so when this
  // rank used them all nothing needs the sums. On a GPU the host then does not wait for
  // them (no copy back, no stream synchronisation); every rank still takes part in the
  // all-reduce, in the same place of the collective order, and NCCL completes it on its
  // stream whatever the host does next. PyTorch's reducer reads its used-parameter map
  // lazily in the same way. On the CPU waiting costs no synchronisation, and a
  // collective nobody waited for could still be in flight when the group is destroyed
  // (Gloo and shm need every rank until it ends): there the sums are always read. The
  // first static_graph iteration keeps the exact sums for the iterations after it.
  const bool all_used =
      std::all_of(iter_.locally_used.begin(), iter_.locally_used.end(), [](bool u) { return u; });
  if (all_used && !static_first_iteration() && !comm.device().is_cpu()) {
    unread_use_ = std::move(work);  // keeps the tensor alive until the collective ends
    return std::vector<int>(static_cast<size_t>(n), 1);
  }
  work.wait();
  const at::Tensor summed = comm.to_host(on_device[0]);
  const int* sums = summed.data_ptr<int>();
  return std::vector<int>(sums, sums + n);
}

// Note [Write-back per bucket]
// Buckets complete in launch order. Each one is written back to the parameters' .grad()
// as soon as it is reduced, while the later ones are still in flight, so the copies
// overlap communication instead of following all of it. Every gradient of a launched
// bucket is final (backward has ended), so nothing else writes them meanwhile. If a
// later bucket fails, the error is thrown with the earlier buckets already averaged:
// the step must not be taken, and the process group has to be recreated anyway.
void Reducer::wait_for_buckets(IterationStats& stats, const std::vector<int>* use) {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (!bucket.future) continue;
    bucket.future->wait();
    const int64_t now = steady_now_ns();
    if (bucket.in_place) {
      bucket_failure(b, *bucket.future);  // the gradients hold the result
    } else {
      const at::Tensor result = bucket_result(b, *bucket.future);
      if (!result.is_same(bucket.buffer)) {
        at::NoGradGuard no_grad;
        bucket.buffer.copy_(result.reshape({-1}));
      }
    }
    // On a device this is only known later: resolve_device_times().
    const double ms = bucket.timing->start ? 0 : bucket.timing->reduction_ms(now);
    stats.bucket_bytes.push_back(bucket.bytes());
    stats.bucket_bytes_sent.push_back(bucket.bytes_sent);
    stats.bytes_sent += bucket.bytes_sent;
    stats.bucket_allreduce_ms.push_back(ms);
    stats.allreduce_total_ms += ms;
    if (use != nullptr) write_back(bucket, *use);
  }
}

at::Tensor Reducer::bucket_result(size_t b, c10::ivalue::Future& future) {
  const Bucket& bucket = buckets_[b];
  bucket_failure(b, future);
  at::Tensor result = hook_result(future.value());
  DDP_CHECK(result.defined() && result.numel() == bucket.numel, "DistributedDataParallel", where(),
            ": comm hook '", comm_hook_->name(), "' completed bucket ", b, " with ",
            result.defined() ? std::to_string(result.numel()) + " elements"
                             : std::string("no tensor"),
            ", but the bucket has ", bucket.numel,
            ". A hook's future must "
            "yield the reduced flat buffer (a Tensor or a list holding one).");
  return result;
}

void Reducer::bucket_failure(size_t b, c10::ivalue::Future& future) {
  const Bucket& bucket = buckets_[b];
  if (future.hasError()) {
    const std::string cause = future.tryRetrieveErrorMessage();
    const std::string text = "DistributedDataParallel" + where() +
                             ": the reduction of "
                             "bucket " +
                             std::to_string(b) + " (" + std::to_string(bucket.params.size()) +
                             " parameters, " + std::to_string(bucket.bytes()) +
                             " bytes, comm hook '" + comm_hook_->name() +
                             "') failed. Cause: " + cause;
    // Every later use of this model reports this (fail_failed): the group is broken.
    iter_.phase = Phase::kFailed;
    failure_ = text;
    const CommFailure kind = classify_comm_failure(cause);
    throw_comm_failure(kind, kind == CommFailure::kTimeout
                                 ? text + ". A peer did not take part in time: check "
                                          "that every rank runs the same number of "
                                          "forward/backward iterations (ddp::join handles "
                                          "ranks with fewer batches)."
                                 : text + ". The process group is broken; recreate it.");
  }
}

void Reducer::write_back(const Bucket& bucket, const std::vector<int>& global_use) {
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < bucket.params.size(); ++k) {
    // Note [Gradients reduced in place]: only stand-ins hold a result to copy.
    if (bucket.in_place && !bucket.staged[k]) continue;
    const size_t i = bucket.params[k];
    if (!global_use.empty() && global_use[i] == 0) continue;  // no rank used it
    at::Tensor& grad = params_[i].mutable_grad();
    const at::Tensor& view = bucket.views[k];
    if (options_.gradient_as_bucket_view) {
      if (!grad.defined() || !grad.is_alias_of(view)) grad = view;
    } else if (!grad.defined()) {
      grad = view.clone();  // used on another rank only
    } else {
      copy_plain(grad, view);  // Note [Streaming bucket copies]
    }
  }
}

void Reducer::reset_iteration() {
  const size_t n = params_.size();
  Iteration& it = iter_;
  it.phase = Phase::kIdle;
  it.callback_queued = false;
  it.ready.assign(n, false);
  it.unused.assign(n, false);
  it.locally_used.assign(n, false);
  it.hook_calls.assign(n, 0);
  it.next_bucket = 0;
  it.num_ready = 0;
  it.raised = false;
  for (Bucket& bucket : buckets_) {
    bucket.pending = bucket.params.size();
    bucket.future.reset();
  }
}

void Reducer::record_trace(const IterationStats& stats, const TimedIteration& timed) const {
  const int64_t forward_end_ns = timed.forward_end_ns;
  const int64_t finalize_start_ns = timed.finalize_start_ns;
  const int64_t wait_start_ns = timed.wait_start_ns;
  const int64_t wait_end_ns = timed.wait_end_ns;
  const std::string iter = "\"iteration\":" + std::to_string(stats.iteration);
  trace_->complete(
      "backward", kMainTrack, trace_us(forward_end_ns), (finalize_start_ns - forward_end_ns) / 1000,
      iter +
          ",\"buckets_launched_before_end\":" + std::to_string(stats.buckets_launched_before_end) +
          ",\"buckets_done_before_end\":" + std::to_string(stats.buckets_done_before_end));
  for (size_t b = 0; b < timed.timings.size(); ++b) {
    trace_->name_track(kBucketTrack + static_cast<int>(b), "bucket " + std::to_string(b));
    const int64_t launch = timed.timings[b]->launch_ns.load();
    if (launch == 0) continue;  // world size 1: nothing was sent
    const int64_t done = timed.timings[b]->done_ns.load();
    trace_->complete("all_reduce", kBucketTrack + static_cast<int>(b), trace_us(launch),
                     ((done != 0 ? done : wait_end_ns) - launch) / 1000,
                     iter + ",\"bucket\":" + std::to_string(b) +
                         ",\"bytes\":" + std::to_string(timed.bytes[b]) +
                         ",\"parameters\":" + std::to_string(timed.params[b]) +
                         ",\"hook\":" + json_quote(comm_hook_->name()));
  }
  trace_->complete("backward.wait", kMainTrack, trace_us(wait_start_ns),
                   (wait_end_ns - wait_start_ns) / 1000, iter);
  trace_->flush();
}

}  // namespace detail
}  // namespace ddp
