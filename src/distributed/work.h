#pragma once

// The collectives in flight: PendingWork, what every Comm returns, and the one family
// of its implementations that the backends share. A backend's own wrapper that adds
// behaviour (the traced comm's records) lives with that backend; everything that only
// waits, completes or copies is here.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Work;
}  // namespace c10d

namespace ddp {
namespace detail {

struct CommConfig;

/// One asynchronous collective in flight.
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  /// Waits until the collective is done; throws ddp's exception types on failure.
  virtual void wait() = 0;
  /// Completes with the collective's output tensors (as c10d's work futures do), or
  /// with its error.
  virtual c10::intrusive_ptr<c10::ivalue::Future> future() = 0;
  /// A receive's sender, after wait() (Work::source_rank). Throws for other works.
  virtual int source_rank();
};

/// A fresh, not yet completed future of a tensor list, as c10d's work futures are.
c10::intrusive_ptr<c10::ivalue::Future> tensor_list_future();

/// A collective that is already done: its future holds `outputs` (the world-size-1
/// path, empty flat collectives).
std::shared_ptr<PendingWork> done_work(std::vector<at::Tensor> outputs);

/// A collective that completes `future` itself (the shm backend's and the hierarchy's
/// worker threads); wait() rethrows the future's error.
std::shared_ptr<PendingWork> future_work(c10::intrusive_ptr<c10::ivalue::Future> future);

/// c10d's work. wait() turns c10d's failures into ddp's exceptions naming `what`
/// (rethrow_comm_error); on NCCL it only makes the current stream wait (Note [NCCL
/// waits on the stream]).
std::shared_ptr<PendingWork> c10d_work(c10::intrusive_ptr<c10d::Work> work,
                                       std::shared_ptr<const CommConfig> config, std::string what);

/// A flat collective's c10d work. Some backends' works for these have no future
/// (Gloo's reduce_scatter in 2.x: "Work::getFuture not implemented"); then future()
/// waits for the work and hands back a completed future holding `output`, as the
/// others do.
std::shared_ptr<PendingWork> flat_work(std::shared_ptr<PendingWork> inner, at::Tensor output);

/// `inner`, then `after` (on the host, once inner is done; it may run twice, so it must
/// be idempotent), then `outputs` as the future's value. An error of `inner` skips
/// `after` and reaches both wait() and the future.
std::shared_ptr<PendingWork> then_work(std::shared_ptr<PendingWork> inner,
                                       std::function<void()> after,
                                       std::vector<at::Tensor> outputs);

/// then_work that copies `from` into `to` (a collective into a scratch tensor whose
/// result still has to reach the caller's), yielding {to}.
std::shared_ptr<PendingWork> copy_after_work(std::shared_ptr<PendingWork> inner, at::Tensor from,
                                             at::Tensor to);

}  // namespace detail
}  // namespace ddp
