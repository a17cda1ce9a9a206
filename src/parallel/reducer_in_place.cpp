// Buckets whose gradients are all-reduced where they are. See Note [Gradients reduced in
// place] below, and Note [Direct all-reduce] in src/distributed/shm/shm_transport.h.

#include "parallel/reducer.h"

#include "distributed/comm.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <tuple>

namespace ddp {
namespace detail {

// Note [Gradients reduced in place]
// With the default hook, the copies of the gradients into their bucket (scaled by
// 1/world_size) and of the averages back are two of the three passes over the
// gradients that DDP makes on a CPU, each bound by memory bandwidth. Where the group can
// reduce the gradient tensors themselves, the scale included (the shm backend, Note
// [Direct all-reduce]), a bucket hands it the list of its gradients instead, and both
// copies go. The result has the bits of the bucket path: the same scaled values, summed
// in the same order.
//
// Whether a bucket is reduced this way is decided when the buckets are made, from what
// every rank shares (the group, the options, the parameters), so every rank issues the
// same collective: not with a comm hook (the hook is given the bucket's buffer), nor with
// gradient_as_bucket_view (the gradients live in the buffer), nor for parameters that
// are not contiguous CPU tensors of a dtype the group scales.
//
// A gradient that cannot be reduced where it is goes through its slot in the bucket's
// buffer, which then stands in for it (staged): an undefined gradient (zeros, as in the
// bucket path), a parameter marked unused this iteration (its own .grad() must not
// change when no rank used it), a gradient that is not contiguous, of another dtype, or
// that overlaps another gradient of the bucket. Only stand-ins are written back at the
// end (write_back skips the others). The buffer is made the first time a stand-in is needed (and under ddp::join, whose
// shadow all-reduces zeros shaped like the gradients), so a model whose gradients all
// reduce in place has none: no memory, and no hole in the heap that later allocations
// would fault in page by page.

bool Reducer::reduces_in_place(const std::vector<size_t>& bucket_params) const {
  if (local() || custom_hook_ || options_.gradient_as_bucket_view || bucket_params.empty()) {
    return false;
  }
  const c10::ScalarType dtype = specs_[bucket_params.front()].dtype;
  if (!comm_of(*pg_).reduces_in_place(dtype, bucket_params.size())) return false;
  return std::all_of(bucket_params.begin(), bucket_params.end(), [&](size_t i) {
    const at::Tensor& p = params_[i];
    return p.device().is_cpu() && p.scalar_type() == dtype && p.is_contiguous() && !p.is_sparse();
  });
}

std::vector<at::Tensor> Reducer::in_place_inputs(Bucket& bucket) {
  at::NoGradGuard no_grad;
  const size_t n = bucket.params.size();
  // (start, bytes, position) of each gradient that can be reduced where it is.
  std::vector<std::tuple<const char*, size_t, size_t>> spans;
  spans.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    const size_t i = bucket.params[k];
    const at::Tensor& grad = params_[i].grad();
    const bool fits = grad.defined() && !iter_.unused[i] && grad.device().is_cpu() &&
                      !grad.is_sparse() && grad.scalar_type() == specs_[i].dtype &&
                      grad.numel() == specs_[i].numel && grad.is_contiguous();
    bucket.staged[k] = !fits;
    if (fits) {
      spans.emplace_back(static_cast<const char*>(grad.data_ptr()),
                         static_cast<size_t>(grad.nbytes()), k);
    }
  }
  // Two gradients that share memory (a user may assign one tensor to two .grad()s)
  // would be reduced twice over: all but the first of them are staged instead.
  std::sort(spans.begin(), spans.end());
  const char* reach = nullptr;  // the end of the last gradient kept in place
  for (const auto& [start, bytes, k] : spans) {
    if (reach != nullptr && start < reach) {
      bucket.staged[k] = true;
    } else {
      reach = start + bytes;
    }
  }
  std::vector<at::Tensor> inputs(n);
  for (size_t k = 0; k < n; ++k) {
    const at::Tensor& grad = params_[bucket.params[k]].grad();
    if (!bucket.staged[k]) {
      inputs[k] = grad;
      continue;
    }
    inputs[k] = stand_ins(bucket)[k];
    if (grad.defined()) {
      inputs[k].copy_(grad);
    } else {
      inputs[k].zero_();
    }
  }
  return inputs;
}

const std::vector<at::Tensor>& Reducer::stand_ins(Bucket& bucket) {
  if (!bucket.buffer.defined()) {
    bucket.buffer = at::empty({bucket.numel}, bucket.options);
    make_views(bucket, params_);
  }
  return bucket.views;
}

c10::intrusive_ptr<c10::ivalue::Future> Reducer::reduce_in_place_async(
    std::vector<at::Tensor> tensors) {
  // The same 1/divisor as the bucket path's scaled copy (Note [Pre-scaled buckets]).
  return comm_of(*pg_).all_reduce_in_place(tensors, 1.0 / divisor_)->future();
}

}  // namespace detail
}  // namespace ddp
