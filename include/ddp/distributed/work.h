#pragma once

// Work: the handle that every *_async collective returns, as torch.distributed's Work.

#include <ATen/core/ivalue.h>

#include <memory>

namespace ddp {

class ProcessGroup;

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
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace ddp
