#include "parallel/reducer.h"
#include "distributed/common/check.h"

#include "distributed/comm.h"
#include "modules/graph_walk.h"
#include "parallel/scaled_copy.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>

namespace ddp {
namespace detail {

std::shared_ptr<Reducer> Reducer::create(std::vector<at::Tensor> params,
                                         std::vector<std::string> names,
                                         std::shared_ptr<ProcessGroup> pg, ReducerOptions options,
                                         std::shared_ptr<TraceWriter> trace) {
  std::shared_ptr<Reducer> reducer(
      new Reducer(std::move(params), std::move(names), std::move(pg), options, std::move(trace)));
  // The output pre-hooks hold a weak_ptr to the reducer, which exists only now. The
  // gradient hooks hold a plain pointer: ~Reducer removes them before anything else goes.
  reducer->self_ = reducer;
  Reducer* self = reducer.get();
  reducer->hooks_ =
      std::make_unique<GradHooks>(reducer->params_, [self](size_t i) { self->on_grad_ready(i); });
  return reducer;
}

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<ProcessGroup> pg, ReducerOptions options,
                 std::shared_ptr<TraceWriter> trace)
    : params_(std::move(params)),
      names_(std::move(names)),
      pg_(std::move(pg)),
      world_size_(pg_->size()),
      trivial_(comm_of(*pg_).trivial()),
      options_(options),
      trace_(std::move(trace)),
      comm_hook_(comm_hooks::allreduce_hook()) {
  for (const auto& p : params_) specs_.push_back(ParamSpec{p.numel(), p.scalar_type(), p.device()});
  set_divisor_locked(world_size_);
  reset_iteration();
  // See Note [Bucket order]: PyTorch's initial buckets until the real order is known.
  install_buckets(initial_buckets(specs_, rebuilds_buckets(options_),
                                  options_.first_bucket_cap_bytes, options_.bucket_cap_bytes));
}

// The gradient hooks go first, so none can reach a half-destroyed reducer. The last
// iteration's trace, when it waits for device events, is written on the way out.
Reducer::~Reducer() {
  hooks_.reset();
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    resolve_device_times();
  } catch (...) {
    // A device that failed has nothing to add to a trace.
  }
}

void Reducer::install_buckets(const BucketAssignment& assignment) {
  assignment_ = assignment;
  slots_ = locate_params(assignment_, params_.size());
  // Collective (the constructor, and the rebuild after the broadcast of the order):
  // the shm backend maps the buffers on every rank (Note [Zero-copy buffers]). A bucket
  // whose gradients are reduced in place gets a buffer only if it needs stand-ins (Note
  // [Gradients reduced in place]): private, made when first needed.
  Comm& comm = comm_of(*pg_);
  std::vector<bool> in_place(assignment_.size(), false);
  for (size_t b = 0; b < assignment_.size(); ++b) in_place[b] = reduces_in_place(assignment_[b]);
  BufferAllocator allocate;
  if (!local()) {
    allocate = [&comm, &in_place](const std::vector<int64_t>& numels,
                                  const std::vector<at::TensorOptions>& options) {
      std::vector<int64_t> shared_numels;
      std::vector<at::TensorOptions> shared_options;
      for (size_t b = 0; b < numels.size(); ++b) {
        if (in_place[b]) continue;
        shared_numels.push_back(numels[b]);
        shared_options.push_back(options[b]);
      }
      std::vector<at::Tensor> shared = comm.allocate_buffers(shared_numels, shared_options);
      std::vector<at::Tensor> buffers;
      for (size_t b = 0, next = 0; b < numels.size(); ++b) {
        buffers.push_back(in_place[b] ? at::Tensor() : shared[next++]);
      }
      return buffers;
    };
  }
  buckets_ = make_buckets(params_, assignment_, allocate);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].in_place = in_place[b];
    buckets_[b].staged.assign(buckets_[b].params.size(), false);
  }
  if (local() || !options_.gradient_as_bucket_view) return;
  // Gradients that already exist move into the buckets, as PyTorch does; the others
  // are adopted when they first arrive (mark_ready).
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& grad = params_[i].mutable_grad();
    if (!grad.defined()) continue;
    const at::Tensor& view = buckets_[slots_[i].bucket].views[slots_[i].index];
    view.copy_(grad);
    grad = view;
  }
}

// ---- synchronisation ----------------------------------------------------------------

void Reducer::enter_no_sync() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++no_sync_depth_;
}

void Reducer::exit_no_sync() {
  std::lock_guard<std::mutex> lock(mutex_);
  --no_sync_depth_;
}

// ---- forward side -------------------------------------------------------------------

bool Reducer::records_ready_order() const {
  return !rebuilt_ && num_reduced_ == 0 && rebuilds_buckets(options_);
}

bool Reducer::before_forward() {
  std::lock_guard<std::mutex> lock(mutex_);
  check_usable();
  check_parameters_unchanged();
  if (!at::GradMode::is_enabled()) return false;
  return no_sync_depth_ == 0 &&
         ((options_.find_unused_parameters && !options_.static_graph) || static_first_iteration());
}

void Reducer::check_parameters_unchanged() const {
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    // A new dtype or device is what gives a parameter a new gradient accumulator
    // (set_data), so comparing them catches that without touching the accumulator.
    if (C10_UNLIKELY(p.numel() != specs_[i].numel || p.scalar_type() != specs_[i].dtype ||
                     p.device() != specs_[i].device)) {
      fail_parameter_changed(i);
    }
  }
}

void Reducer::rebuild_if_due() {
  std::lock_guard<std::mutex> lock(mutex_);
  maybe_rebuild_buckets();
}

void Reducer::maybe_rebuild_buckets() {
  if (rebuilt_ || num_reduced_ == 0) return;
  rebuilt_ = true;
  if (!rebuilds_buckets(options_)) return;

  // Our order: gradients as they arrived, then any that never did (reverse order).
  const size_t n = params_.size();
  std::vector<int64_t> order;
  std::vector<bool> seen(n, false);
  for (size_t i : ready_order_) {
    if (!seen[i]) order.push_back(static_cast<int64_t>(i));
    seen[i] = true;
  }
  for (size_t i : reverse_order(n)) {
    if (!seen[i]) order.push_back(static_cast<int64_t>(i));
  }
  ready_order_.clear();

  // Rank 0's order wins, so every rank launches the same buckets in the same order.
  const at::Tensor agreed_host = broadcast_host(*pg_, at::tensor(order, at::kLong), /*src=*/0);
  const int64_t* data = agreed_host.data_ptr<int64_t>();
  std::vector<size_t> agreed(n);
  for (size_t k = 0; k < n; ++k) agreed[k] = static_cast<size_t>(data[k]);
  install_buckets(
      assign_buckets(specs_, agreed, options_.first_bucket_cap_bytes, options_.bucket_cap_bytes));
  if (comm_of(*pg_).config().debug_detail) check_buckets_agree();
}

void Reducer::after_forward(const std::vector<at::Tensor>& outputs,
                            const char* unknown_output_type) {
  if (!at::GradMode::is_enabled()) return;  // no graph: no backward to reduce
  std::lock_guard<std::mutex> lock(mutex_);
  if (no_sync_depth_ > 0) {
    // An armed forward stays armed: the backward through its output is reduced, and
    // gradients of this forward's output join it (Note [Iteration phases]).
    if (iter_.phase != Phase::kArmed) iter_.phase = Phase::kLocal;
    return;
  }
  const bool find_unused = options_.find_unused_parameters && !options_.static_graph;
  if (find_unused && unknown_output_type != nullptr) fail_unknown_output(unknown_output_type);
  iter_.phase = Phase::kArmed;
  iter_.forward_id = ++forwards_;
  iter_.callback_queued = false;
  iter_.forward_end_ns = steady_now_ns();
  std::fill(iter_.unused.begin(), iter_.unused.end(), false);
  if (options_.static_graph) {
    if (num_reduced_ > 0) {
      for (size_t i = 0; i < params_.size(); ++i) iter_.unused[i] = expected_calls_[i] == 0;
    }
  } else if (find_unused) {
    const auto reached = reached_accumulators(outputs, hooks_->accumulators());
    for (size_t i = 0; i < params_.size(); ++i) iter_.unused[i] = !reached[i];
  }
  // See Note [End-of-backward callback]: only the first static_graph iteration needs
  // the end of the outermost backward.
  if (static_first_iteration()) hook_output_nodes(outputs, self_, iter_.forward_id);
}

// ---- backward side ------------------------------------------------------------------

void Reducer::queue_finalize() {
  iter_.callback_queued = true;
  // See Note [End-of-backward callback] for why a plain pointer is safe here.
  torch::autograd::Engine::get_default_engine().queue_callback(
      [self = this] { self->finalize_backward(); });
}

void Reducer::on_output_grad(uint64_t forward_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Only the latest synced forward's outputs count, once per backward.
  if (forward_id != iter_.forward_id || iter_.callback_queued) return;
  if (iter_.phase != Phase::kArmed && iter_.phase != Phase::kReducing) return;
  queue_finalize();
}

void Reducer::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    grad_ready(index);
  } catch (...) {
    iter_.raised = true;  // reported at the next forward too
    throw;
  }
}

void Reducer::grad_ready(size_t index) {
  // Only a defined gradient counts as use: a hook may fire with none (an output that
  // did not contribute), and a parameter no rank used keeps its .grad() untouched.
  if (params_[index].grad().defined()) iter_.locally_used[index] = true;
  switch (iter_.phase) {
    case Phase::kLocal:
      return;  // no_sync: the gradient stays where the engine put it
    case Phase::kIdle:
      fail_backward_without_forward(index);
    case Phase::kFailed:
      fail_failed();
    case Phase::kArmed:
      begin_backward();
      break;
    case Phase::kReducing:
      break;
  }

  if (options_.static_graph) {
    const int calls = ++iter_.hook_calls[index];
    if (num_reduced_ == 0) {
      // First iteration: count arrivals, reduce everything in finalize_backward.
      if (calls == 1) ready_order_.push_back(index);
      return;
    }
    if (calls > expected_calls_[index]) fail_static_graph_changed(index, calls);
    if (calls < expected_calls_[index]) return;
  }
  if (iter_.ready[index]) fail_ready_twice(index);
  if (records_ready_order()) ready_order_.push_back(index);
  mark_ready(index);
  if (iter_.num_ready == params_.size()) all_ready();
}

void Reducer::all_ready() {
  // See Note [End-of-backward callback]. With nothing to wait for or write back, the
  // iteration ends right here.
  if (local()) {
    finalize_locked();
  } else if (!iter_.callback_queued) {
    queue_finalize();
  }
}

void Reducer::begin_backward() {
  iter_.phase = Phase::kReducing;
  if (static_first_iteration()) {
    if (!iter_.callback_queued) queue_finalize();  // no output pre-hook ran
    return;
  }
  // Unused parameters contribute zeros (or what they accumulated under no_sync). They
  // are marked now, not in forward, so nothing is launched before backward starts.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (iter_.unused[i]) mark_ready(i);
  }
}

// Note [Pre-scaled buckets]
// With the default hook, each gradient is multiplied by 1/world_size while it is copied
// into its bucket (one pass instead of a copy and a division), and the bucket is then
// summed. This is PyTorch's arithmetic too (x * (1/n), or x / n for a gradient that
// already lives in its bucket), so both produce the same bits. A custom hook gets the
// plain sum of the local gradients, as in PyTorch.
void Reducer::mark_ready(size_t index) {
  const Slot slot = slots_[index];
  Bucket& bucket = buckets_[slot.bucket];
  const at::Tensor& grad = params_[index].grad();
  DDP_CHECK(!grad.defined() || !grad.is_sparse(), "DistributedDataParallel", where(),
            ": parameter '", names_[index],
            "' has a sparse gradient, which DDP does not "
            "reduce. Use a dense gradient (e.g. Embedding without sparse=true).");
  if (!local() && !bucket.in_place) {  // in place: nothing to copy (launch)
    at::Tensor& view = bucket.views[slot.index];
    at::NoGradGuard no_grad;
    if (!grad.defined()) {
      view.zero_();
    } else {
      const bool in_bucket = options_.gradient_as_bucket_view && grad.is_alias_of(view);
      if (in_bucket) {
        // Accumulated straight into the bucket by the engine.
        if (prescaled()) view.div_(divisor_);
      } else {
        if (prescaled()) {
          copy_scaled(view, grad, inverse_divisor_);
        } else {
          view.copy_(grad);
        }
        // With gradient_as_bucket_view, the first arrival (or one after
        // zero_grad(set_to_none)) adopts the bucket view, so that later backward
        // passes accumulate straight into the bucket.
        if (options_.gradient_as_bucket_view) params_[index].mutable_grad() = view;
      }
    }
  }
  iter_.ready[index] = true;
  ++iter_.num_ready;
  TORCH_INTERNAL_ASSERT(bucket.pending > 0, "bucket ", slot.bucket, " over-counted");
  if (--bucket.pending > 0) return;
  // See Note [Bucket order]: launch strictly in order.
  while (iter_.next_bucket < buckets_.size() && buckets_[iter_.next_bucket].pending == 0) {
    const size_t b = iter_.next_bucket++;
    if (!local()) launch(b);
  }
}

void Reducer::launch(size_t b) {
  Bucket& bucket = buckets_[b];
  // A fresh timing record per launch: a completion callback of an earlier iteration
  // that runs late cannot overwrite this one.
  auto timing = std::make_shared<BucketTiming>();
  timing->launch_ns = steady_now_ns();
  const c10::Device device = params_[bucket.params.front()].device();
  // Note [Device time]: on a GPU, after the gradients of the bucket on their stream.
  timing->start = DeviceEvent::record(device);
  bucket.timing = timing;
  bucket.bytes_sent = bucket.bytes();  // a comm hook may say otherwise (reduce_async)
  auto future = bucket.in_place ? reduce_in_place_async(in_place_inputs(bucket))
                                : reduce_async(b, bucket.buffer);
  future->addCallback([timing, device](c10::ivalue::Future&) {
    timing->done_ns = steady_now_ns();
    // The callback's current stream waits for the collective: an event there ends it.
    if (timing->start) timing->set_end(DeviceEvent::record(device));
  });
  bucket.future = std::move(future);
}

c10::intrusive_ptr<c10::ivalue::Future> Reducer::reduce_async(size_t b, at::Tensor buffer) {
  const Bucket& bucket = buckets_[b];
  c10::intrusive_ptr<c10::ivalue::Future> future;
  if (prescaled()) {
    // The default hook, already divided (see Note [Pre-scaled buckets]).
    std::vector<at::Tensor> tensors{std::move(buffer)};
    future = pg_->all_reduce_async(tensors, ReduceOp::SUM).future();
  } else {
    std::vector<at::Tensor> params;
    params.reserve(bucket.params.size());
    for (size_t i : bucket.params) params.push_back(params_[i]);
    GradBucket grad_bucket(b, buckets_.size(), std::move(buffer), std::move(params), bucket.offsets,
                           *pg_);
    future = comm_hook_->run_hook(grad_bucket);
    buckets_[b].bytes_sent = grad_bucket.bytes_sent();
  }
  DDP_CHECK(future, "DistributedDataParallel", where(), ": comm hook '", comm_hook_->name(),
            "' returned a null future for bucket ", b,
            "; a hook must return the future "
            "of its reduction.");
  return future;
}

// ---- configuration and queries ------------------------------------------------------

void Reducer::register_comm_hook(std::shared_ptr<CommHook> hook) {
  DDP_CHECK(hook, "register_comm_hook got a null hook");
  std::lock_guard<std::mutex> lock(mutex_);
  DDP_CHECK(!custom_hook_, "DistributedDataParallel", where(), ": a comm hook ('",
            comm_hook_->name(),
            "') is already registered; register_comm_hook can be "
            "called only once, before the first backward.");
  DDP_CHECK(num_reduced_ == 0 && iter_.phase != Phase::kReducing, "DistributedDataParallel",
            where(), ": register_comm_hook('", hook->name(),
            "') must be called before "
            "the first backward, but ",
            num_reduced_,
            " iteration(s) were already reduced "
            "with '",
            comm_hook_->name(),
            "'. Register the hook right after constructing "
            "DDP, on every rank.");
  const bool was_local = local();
  const bool any_in_place =
      std::any_of(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.in_place; });
  comm_hook_ = std::move(hook);
  custom_hook_ = true;
  // World size 1 had no bucket buffers, and buckets reduced in place have none of the
  // group's; the hook needs buffers that the group reduces (collective, as on every rank).
  if (was_local || any_in_place) install_buckets(assignment_);
}

BucketAssignment Reducer::bucket_indices() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return assignment_;
}

IterationStats Reducer::last_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  resolve_device_times();
  return last_stats_;
}

}  // namespace detail
}  // namespace ddp
