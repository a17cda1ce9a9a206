// The reducer under ddp::join: the divisor of ranks still training, and the shadow of
// one reduced iteration on a rank that is out of inputs. See Note [Join rounds].

#include "parallel/reducer.h"
#include "distributed/common/check.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace ddp {
namespace detail {

bool Reducer::join_forward_syncs() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Under join, the round of each forward tells the joined ranks whether a reduction
  // follows it; a second forward before that reduction would announce one that never
  // comes (or hide one), and the ranks would issue different collectives.
  DDP_CHECK(iter_.phase != Phase::kArmed, "DistributedDataParallel", where(),
            ": inside ddp::join, a forward whose backward is reduced must be followed by "
            "that backward before the next forward, but forward #",
            forwards_,
            " has not been backwarded yet. Call backward on its loss first, or run the "
            "extra forward without gradients (torch::NoGradGuard).");
  return no_sync_depth_ == 0;
}

void Reducer::set_divisor(int divisor) {
  std::lock_guard<std::mutex> lock(mutex_);
  set_divisor_locked(divisor);
}

void Reducer::set_divisor_locked(int divisor) {
  TORCH_INTERNAL_ASSERT(divisor >= 1 && divisor <= world_size_, "divisor ", divisor);
  if (divisor == divisor_ && inverse_divisor_.defined()) return;
  divisor_ = divisor;
  inverse_divisor_ = at::scalar_tensor(1.0 / divisor, at::kDouble);
}

void Reducer::begin_shadowing() {
  std::lock_guard<std::mutex> lock(mutex_);
  check_usable();
  DDP_CHECK(iter_.phase != Phase::kArmed, "DistributedDataParallel", where(),
            ": the body of ddp::join ended after a forward whose backward is reduced (#", forwards_,
            ") but before that backward; the other ranks would wait for its "
            "gradients. Run backward on every such forward inside the body.");
  // Gradients accumulated under no_sync stay in .grad(); only the bookkeeping of what
  // this rank used goes, so that the shadowed iterations count it as contributing zeros.
  reset_iteration();
}

void Reducer::shadow_reduction() {
  std::lock_guard<std::mutex> lock(mutex_);
  check_usable();
  TORCH_INTERNAL_ASSERT(!local(), "a world of one has nobody to shadow");
  // The trainers launch every bucket, in bucket order, then count parameter use. The
  // zeros go into the buckets' own buffers, as the trainers' gradients do: on shm those
  // live in shared memory and are reduced in place, and every rank must pass the same
  // kind of buffer (Note [Zero-copy buffers]). Gradients that live in the buckets
  // (gradient_as_bucket_view) are put back afterwards; otherwise a buffer holds nothing
  // between iterations.
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
  std::vector<at::Tensor> saved(buckets_.size());
  futures.reserve(buckets_.size());
  {
    at::NoGradGuard no_grad;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (buckets_[b].in_place) stand_ins(buckets_[b]);
      at::Tensor buffer = buckets_[b].buffer;
      if (options_.gradient_as_bucket_view) saved[b] = buffer.clone();
      buffer.zero_();
      // Buckets reduced in place: the trainers pass their gradients, shaped like the
      // views (Note [Gradients reduced in place]).
      futures.push_back(buckets_[b].in_place ? reduce_in_place_async(buckets_[b].views)
                                             : reduce_async(b, buffer));
    }
  }
  for (size_t b = 0; b < futures.size(); ++b) {
    futures[b]->wait();
    if (buckets_[b].in_place) {
      bucket_failure(b, *futures[b]);
    } else {
      bucket_result(b, *futures[b]);
    }
  }
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (saved[b].defined()) buckets_[b].buffer.copy_(saved[b]);
  }
  const std::vector<int> use = global_use();  // this rank's part: all zeros
  if (static_first_iteration() && expected_calls_.empty()) {
    // The first static_graph iteration counts each parameter's gradient arrivals; this
    // rank saw none, so it assumes one each (a later backward that differs says so).
    expected_calls_.assign(params_.size(), 1);
  }
  end_reduced_iteration(use);
}

}  // namespace detail
}  // namespace ddp
