#pragma once

// A bucket's memory and per-iteration state. Its buffer is one flat tensor holding the
// gradients of its parameters back to back; `views` are slices of it shaped like each
// parameter.
//
// Note [Plain bucket views]
// The views are made below the autograd view layer (AutoDispatchBelowADInplaceOrView),
// so they alias the buffer's storage without being autograd views. With
// gradient_as_bucket_view they become the parameters' .grad(), and LibTorch's
// Optimizer::zero_grad() calls grad.detach_(), which autograd refuses on views
// ("Can't detach views in-place").

#include "parallel/bucket_assignment.h"
#include "distributed/debug/device_event.h"
#include "parallel/clock.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace ddp {
namespace detail {

/// Written by the future's completion callback (a communication thread), read by the
/// end-of-backward callback, hence atomics and a lock.
struct BucketTiming {
  std::atomic<int64_t> launch_ns{0};
  std::atomic<int64_t> done_ns{0};
  // Note [Device time]: a bucket on a GPU is timed by events. `start` is recorded at
  // launch, before the callback can run; `end` by the callback.
  std::shared_ptr<DeviceEvent> start;

  void set_end(std::shared_ptr<DeviceEvent> e) {
    std::lock_guard<std::mutex> lock(mutex);
    end = std::move(e);
  }
  std::shared_ptr<DeviceEvent> end_event() {
    std::lock_guard<std::mutex> lock(mutex);
    return end;
  }
  /// Whether the reduction has finished; never blocks. On a device, by its events.
  bool finished(const c10::ivalue::Future& future) {
    if (!start) return future.completed();
    auto e = end_event();
    return e && e->done();
  }
  /// Launch to completion in ms; on a device this waits for the end event. On the host,
  /// `waited_ns` (when the waiter saw the future complete) stands in for a completion
  /// callback that has not run yet.
  double reduction_ms(int64_t waited_ns = 0) {
    if (start) {
      auto e = end_event();
      if (!e) return 0;
      e->synchronize();
      return e->ms_since(*start);
    }
    const int64_t launch = launch_ns.load();
    const int64_t done = done_ns.load() != 0 ? done_ns.load() : waited_ns;
    return done != 0 ? static_cast<double>(done - launch) / 1e6 : 0;
  }

 private:
  std::mutex mutex;
  std::shared_ptr<DeviceEvent> end;
};

struct Bucket {
  at::Tensor buffer;  // undefined for a bucket reduced in place until it needs one
  int64_t numel = 0;  // of the buffer
  at::TensorOptions options;
  std::vector<size_t> params;     // reduced-parameter indices, in buffer order
  std::vector<int64_t> offsets;   // element offset of each in buffer
  std::vector<at::Tensor> views;  // see Note [Plain bucket views]
  // Note [Gradients reduced in place]: the gradients themselves are all-reduced, and
  // the buffer only stands in for those that cannot be (staged[k]: views[k] did).
  bool in_place = false;
  std::vector<bool> staged;
  size_t pending = 0;                              // parameters not yet ready this iteration
  c10::intrusive_ptr<c10::ivalue::Future> future;  // reduction in flight, or null
  std::shared_ptr<BucketTiming> timing = std::make_shared<BucketTiming>();
  int64_t bytes_sent = 0;  // this launch's: what its collectives were given

  int64_t bytes() const { return numel * static_cast<int64_t>(options.dtype().itemsize()); }
};

/// Where a parameter's gradient lives: bucket index and position inside it.
struct Slot {
  size_t bucket = 0;
  size_t index = 0;
};

/// Makes zeroed 1-D buffers of numels[i] elements with options[i] (Comm::allocate_buffers).
using BufferAllocator =
    std::function<std::vector<at::Tensor>(const std::vector<int64_t>& numels,
                                          const std::vector<at::TensorOptions>& options)>;

/// Buckets for `assignment` over `params` (the reduced parameters): zeroed buffers from
/// `allocate` and their views, or only the bookkeeping when `allocate` is empty (world
/// size 1) or gives an undefined tensor for a bucket (see make_views).
std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& params,
                                 const BucketAssignment& assignment,
                                 const BufferAllocator& allocate);

/// slots[i]: where params[i] is.
std::vector<Slot> locate_params(const BucketAssignment& assignment, size_t num_params);

/// A slice of `buffer` shaped like `sizes`, aliasing it without being an autograd view.
at::Tensor plain_view(const at::Tensor& buffer, int64_t offset, at::IntArrayRef sizes);

/// Note [Bucket view layout]
/// param's slot in `buffer` (param.numel() elements from `offset`), laid out like param:
/// a parameter that is dense but not contiguous (channels_last) gets a view with its own
/// strides, as in PyTorch, so that a gradient as bucket view keeps the parameter's
/// layout (AccumulateGrad's layout contract) and copies do not transpose. Any other
/// parameter gets a contiguous view.
at::Tensor bucket_view(const at::Tensor& buffer, int64_t offset, const at::Tensor& param);

/// A comm hook's or a collective's result: a Tensor, or a list whose first element is
/// one; undefined otherwise. (Defined in comm_hooks.cpp.)
at::Tensor hook_result(const c10::IValue& value);

/// bucket.views, one per parameter, over bucket.buffer.
void make_views(Bucket& bucket, const std::vector<at::Tensor>& params);

}  // namespace detail
}  // namespace ddp
