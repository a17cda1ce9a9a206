#include "distributed/backends/hier_comm.h"

#include "distributed/common/check.h"
#include "distributed/backends/shm_comm.h"
#include "distributed/task_queue.h"

#include <ddp/errors.h>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <functional>

namespace ddp {
namespace detail {

namespace {

bool shm_carries(const std::vector<at::Tensor>& tensors) {
  return tensors.size() == 1 && tensors[0].defined() && tensors[0].is_cpu() &&
         shm_reduces(tensors[0].scalar_type());
}

class HierComm final : public Comm {
 public:
  HierComm(CommConfig config, HostLayout layout, std::unique_ptr<Comm> global,
           std::unique_ptr<Comm> local, std::unique_ptr<Comm> leaders)
      : Comm(std::move(config)),
        layout_(std::move(layout)),
        global_(std::move(global)),
        local_(std::move(local)),
        leaders_(std::move(leaders)),
        queue_(std::make_unique<TaskQueue>()) {}

  ~HierComm() override { shutdown(); }

  std::shared_ptr<PendingWork> all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op) override {
    check_devices("all_reduce", tensors);
    // Shared memory folds SUM, MAX and MIN; PRODUCT and the bitwise ops go to Gloo.
    const bool folds = op == ReduceOp::SUM || op == ReduceOp::MAX || op == ReduceOp::MIN;
    if (!folds || !shm_carries(tensors)) return global().all_reduce(tensors, op);
    DDP_CHECK(queue_, "process group of ", where(), " was already shut down");
    at::Tensor t = tensors[0];
    auto future = tensor_list_future();
    in_flight_.fetch_add(1, std::memory_order_acq_rel);
    queue_->submit([this, t, op, future] {
      std::exception_ptr error = run_all_reduce(t, op);
      // Not in flight any more before anyone can see it complete (shutdown reads this).
      in_flight_.fetch_sub(1, std::memory_order_acq_rel);
      if (error) {
        future->setError(error);
      } else {
        future->markCompleted(c10::IValue(std::vector<at::Tensor>{t}));
      }
    });
    return future_work(std::move(future));
  }

  std::exception_ptr run_all_reduce(const at::Tensor& t, ReduceOp op) {
    if (shut_down_.load(std::memory_order_acquire)) {
      return std::make_exception_ptr(ProcessGroupError(
          "all_reduce on " + where() + " was still queued when the group was shut down"));
    }
    const char* step = "the all-reduce within the host (shared memory)";
    try {
      std::vector<at::Tensor> one{t};
      if (local_) local_->all_reduce(one, op)->wait();
      if (leaders_) {
        step = "the all-reduce among the hosts' leaders (gloo)";
        leaders_->all_reduce(one, op)->wait();
      }
      if (local_) {
        step = "the broadcast from the host's leader (shared memory)";
        local_->broadcast(one, 0)->wait();
      }
    } catch (const std::exception& e) {
      // The host's other ranks may be waiting for this one's broadcast: stop them now,
      // not at their timeout.
      if (local_) abort_shm_comm(*local_);
      return wrap(e, step);
    }
    return nullptr;
  }

  std::shared_ptr<PendingWork> broadcast(std::vector<at::Tensor>& tensors, int src) override {
    return global().broadcast(tensors, src);
  }
  std::shared_ptr<PendingWork> all_gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs) override {
    return global().all_gather(outputs, inputs);
  }
  std::shared_ptr<PendingWork> reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                     ReduceOp op) override {
    return global().reduce_scatter_tensor(output, input, op);
  }
  std::shared_ptr<PendingWork> reduce_scatter_tensor_scratch(at::Tensor& output, at::Tensor& input,
                                                             ReduceOp op) override {
    return global().reduce_scatter_tensor_scratch(output, input, op);
  }
  std::shared_ptr<PendingWork> all_gather_into_tensor(at::Tensor& output,
                                                      at::Tensor& input) override {
    return global().all_gather_into_tensor(output, input);
  }
  // The rest of torch.distributed's collectives and point to point: the Gloo group of
  // all ranks.
  std::shared_ptr<PendingWork> reduce(std::vector<at::Tensor>& tensors, int dst,
                                      ReduceOp op) override {
    return global().reduce(tensors, dst, op);
  }
  std::shared_ptr<PendingWork> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                      std::vector<at::Tensor>& inputs, int dst) override {
    return global().gather(outputs, inputs, dst);
  }
  std::shared_ptr<PendingWork> scatter(std::vector<at::Tensor>& outputs,
                                       std::vector<std::vector<at::Tensor>>& inputs,
                                       int src) override {
    return global().scatter(outputs, inputs, src);
  }
  std::shared_ptr<PendingWork> reduce_scatter(std::vector<at::Tensor>& outputs,
                                              std::vector<std::vector<at::Tensor>>& inputs,
                                              ReduceOp op) override {
    return global().reduce_scatter(outputs, inputs, op);
  }
  std::shared_ptr<PendingWork> all_to_all(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs) override {
    return global().all_to_all(outputs, inputs);
  }
  std::shared_ptr<PendingWork> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_splits,
                                                 std::vector<int64_t>& input_splits) override {
    return global().all_to_all_single(output, input, output_splits, input_splits);
  }
  std::shared_ptr<PendingWork> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return global().send(tensors, dst, tag);
  }
  std::shared_ptr<PendingWork> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return global().recv(tensors, src, tag);
  }
  std::vector<std::shared_ptr<PendingWork>> batch_p2p(std::vector<P2P>& ops) override {
    return global().batch_p2p(ops);
  }
  void barrier() override { global().barrier(); }

  // The hosts' leaders reduce with Gloo.
  bool reduces_dtype(c10::ScalarType dtype) const override {
    return global_ ? global_->reduces_dtype(dtype) : true;
  }

  void store_set(const std::string& key, const std::string& value) override {
    global().store_set(key, value);
  }
  std::optional<std::string> store_try_get(const std::string& key) override {
    return global().store_try_get(key);
  }

  void shutdown() override {
    // The host group first: a hierarchical all-reduce still running then fails at once
    // instead of waiting for peers that will never come.
    // Only with work in flight on this rank: a peer may still be reading the last
    // broadcast that this rank has finished.
    shut_down_.store(true, std::memory_order_release);
    if (local_ && in_flight_.load(std::memory_order_acquire) > 0) abort_shm_comm(*local_);
    if (queue_) {
      queue_->stop();
      queue_.reset();
    }
    for (auto* c : {&local_, &leaders_, &global_}) {
      if (*c) {
        (*c)->shutdown();
        c->reset();
      }
    }
  }

 private:
  Comm& global() {
    DDP_CHECK(global_, "process group of ", where(), " was already shut down");
    return *global_;
  }

  std::string where() const {
    return "rank " + std::to_string(config_->rank) + " of " + std::to_string(config_->world_size) +
           " (hier: host " + std::to_string(layout_.host) + " of " + std::to_string(layout_.hosts) +
           ", local rank " + std::to_string(layout_.local_rank) + " of " +
           std::to_string(layout_.local_size) + ")";
  }

  std::exception_ptr wrap(const std::exception& e, const char* step) const {
    const std::string text = "all_reduce on " + where() + ": " + step + " failed: " + e.what();
    if (dynamic_cast<const TimeoutError*>(&e)) return std::make_exception_ptr(TimeoutError(text));
    if (dynamic_cast<const MismatchError*>(&e)) return std::make_exception_ptr(MismatchError(text));
    return std::make_exception_ptr(
        ProcessGroupError(text + " The process group is broken; destroy it and create a new one."));
  }

  HostLayout layout_;
  std::unique_ptr<Comm> global_;
  std::unique_ptr<Comm> local_;
  std::unique_ptr<Comm> leaders_;
  std::unique_ptr<TaskQueue> queue_;
  std::atomic<bool> shut_down_{false};
  std::atomic<int> in_flight_{0};
};

}  // namespace

std::unique_ptr<Comm> make_hier_comm(CommConfig config, HostLayout layout,
                                     std::unique_ptr<Comm> global, std::unique_ptr<Comm> local,
                                     std::unique_ptr<Comm> leaders) {
  config.backend = "hier";
  return std::make_unique<HierComm>(std::move(config), std::move(layout), std::move(global),
                                    std::move(local), std::move(leaders));
}

}  // namespace detail
}  // namespace ddp
