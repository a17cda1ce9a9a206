#pragma once

// Work: the handle that every *_async collective returns, as torch.distributed's Work.

#include <ATen/core/ivalue.h>

#include <memory>

namespace ddp {

class ProcessGroup;
class Work;

namespace detail {
class PendingWork;
/// The public handle of a backend's work.
Work make_work(std::shared_ptr<PendingWork> pending);
}  // namespace detail

/// A handle to an asynchronous collective.
class Work {
 public:
  /// Blocks until done. Throws TimeoutError or ProcessGroupError.
  void wait();
  /// A future that completes with the collective's output tensors.
  c10::intrusive_ptr<c10::ivalue::Future> future();
  /// For irecv: the rank the tensor came from (the one asked for, or, from any source,
  /// the sender), once wait() returned; PyTorch's work._source_rank(). Throws for any
  /// other work.
  int source_rank();

 private:
  friend class ProcessGroup;
  friend Work detail::make_work(std::shared_ptr<detail::PendingWork> pending);
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace ddp
