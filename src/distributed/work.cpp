#include "distributed/work.h"

#include "distributed/comm.h"

#include <ATen/core/jit_type.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <mutex>

namespace ddp {
namespace detail {

int PendingWork::source_rank() {
  TORCH_CHECK(false, "source_rank() is only for the work of a recv or irecv (the rank the tensor "
                     "came from); this work is a collective or a send.");
}

namespace {

class DoneWork final : public PendingWork {
 public:
  explicit DoneWork(std::vector<at::Tensor> outputs) : outputs_(std::move(outputs)) {}
  void wait() override {}
  c10::intrusive_ptr<c10::ivalue::Future> future() override {
    auto future = tensor_list_future();
    future->markCompleted(c10::IValue(outputs_));
    return future;
  }

 private:
  std::vector<at::Tensor> outputs_;
};

class FutureWork final : public PendingWork {
 public:
  explicit FutureWork(c10::intrusive_ptr<c10::ivalue::Future> future)
      : future_(std::move(future)) {}
  void wait() override {
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
  }
  c10::intrusive_ptr<c10::ivalue::Future> future() override { return future_; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class C10dWork final : public PendingWork {
 public:
  C10dWork(c10::intrusive_ptr<c10d::Work> work, std::shared_ptr<const CommConfig> config,
           std::string what)
      : work_(std::move(work)), config_(std::move(config)), what_(std::move(what)) {}

  void wait() override {
    try {
      // Note [NCCL waits on the stream]: with an explicit timeout, WorkNCCL::wait blocks
      // the host until the kernel finishes. Without one it only makes the current CUDA
      // stream wait on NCCL's (an event), which is what DDP wants; NCCL's watchdog
      // enforces the group's timeout instead. Gloo's wait is a host wait either way.
      if (config_->backend == "nccl") {
        work_->wait();
      } else {
        work_->wait(config_->timeout);
      }
    } catch (const std::exception& e) {
      rethrow_comm_error(e, *config_, what_);
    }
  }

  c10::intrusive_ptr<c10::ivalue::Future> future() override { return work_->getFuture(); }
  int source_rank() override { return work_->sourceRank(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  // Shared, not borrowed: a Work may outlive its group's shutdown().
  std::shared_ptr<const CommConfig> config_;
  std::string what_;
};

class FlatWork final : public PendingWork {
 public:
  FlatWork(std::shared_ptr<PendingWork> inner, at::Tensor output)
      : inner_(std::move(inner)), output_(std::move(output)) {}
  void wait() override { inner_->wait(); }
  c10::intrusive_ptr<c10::ivalue::Future> future() override {
    try {
      return inner_->future();
    } catch (const c10::Error&) {
      inner_->wait();
      return DoneWork({output_}).future();
    }
  }
  int source_rank() override { return inner_->source_rank(); }

 private:
  std::shared_ptr<PendingWork> inner_;
  at::Tensor output_;
};

// Note [After runs once]
// `after` (a copy out of a temporary, say) runs once, whichever asks first: wait(), or
// the callback of future() when the inner work completes (the flight recorder takes
// every work's future). Both paths take the same lock, so wait() returns only once the
// copy is done, and a late callback never repeats it over what the caller has written
// since (it did: a reduce-scatter's result copied again over gradients zeroed after the
// step).
class ThenWork final : public PendingWork {
 public:
  ThenWork(std::shared_ptr<PendingWork> inner, std::function<void()> after,
           std::vector<at::Tensor> outputs)
      : inner_(std::move(inner)),
        once_(std::make_shared<Once>(std::move(after))),
        outputs_(std::move(outputs)) {}

  void wait() override {
    inner_->wait();
    once_->run();
  }

  c10::intrusive_ptr<c10::ivalue::Future> future() override {
    std::shared_ptr<Once> once = once_;
    std::vector<at::Tensor> outputs = outputs_;
    return inner_->future()->then(
        [once, outputs](c10::ivalue::Future& done) -> c10::IValue {
          (void)done.value();  // rethrows inner's error: then nothing is copied
          once->run();
          return c10::IValue(outputs);
        },
        c10::ListType::create(c10::TensorType::get()));
  }

  int source_rank() override { return inner_->source_rank(); }

 private:
  struct Once {
    explicit Once(std::function<void()> f) : after(std::move(f)) {}
    void run() {
      std::lock_guard<std::mutex> lock(mutex);
      if (done) return;
      done = true;
      if (after) after();
    }
    std::mutex mutex;
    bool done = false;
    std::function<void()> after;
  };
  std::shared_ptr<PendingWork> inner_;
  std::shared_ptr<Once> once_;
  std::vector<at::Tensor> outputs_;
};

}  // namespace

c10::intrusive_ptr<c10::ivalue::Future> tensor_list_future() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

std::shared_ptr<PendingWork> done_work(std::vector<at::Tensor> outputs) {
  return std::make_shared<DoneWork>(std::move(outputs));
}

std::shared_ptr<PendingWork> future_work(c10::intrusive_ptr<c10::ivalue::Future> future) {
  return std::make_shared<FutureWork>(std::move(future));
}

std::shared_ptr<PendingWork> c10d_work(c10::intrusive_ptr<c10d::Work> work,
                                       std::shared_ptr<const CommConfig> config, std::string what) {
  return std::make_shared<C10dWork>(std::move(work), std::move(config), std::move(what));
}

std::shared_ptr<PendingWork> flat_work(std::shared_ptr<PendingWork> inner, at::Tensor output) {
  return std::make_shared<FlatWork>(std::move(inner), std::move(output));
}

std::shared_ptr<PendingWork> then_work(std::shared_ptr<PendingWork> inner,
                                       std::function<void()> after,
                                       std::vector<at::Tensor> outputs) {
  return std::make_shared<ThenWork>(std::move(inner), std::move(after), std::move(outputs));
}

std::shared_ptr<PendingWork> copy_after_work(std::shared_ptr<PendingWork> inner, at::Tensor from,
                                             at::Tensor to) {
  return then_work(std::move(inner), [from, to]() mutable { to.copy_(from); }, {to});
}

}  // namespace detail
}  // namespace ddp
