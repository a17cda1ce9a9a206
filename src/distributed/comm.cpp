// What every Comm shares: device checks (Note [Device discipline]), the one-rank group
// without a backend (LocalComm), and the reading of backend failures (Note
// [Classifying c10d failures]).

#include "distributed/comm.h"

#include "distributed/common/check.h"

#include <ddp/errors.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <map>
#include <mutex>

namespace ddp {
namespace detail {

std::string where(const CommConfig& c) {
  return "rank " + std::to_string(c.rank) + " of " + std::to_string(c.world_size) + " (" +
         c.backend + ", " + c.init_method + ")";
}

std::string cause_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

namespace {

// World size 1 (Note [World size 1]): nothing to exchange, every collective is the
// identity.
class LocalComm final : public Comm {
 public:
  explicit LocalComm(CommConfig config) : Comm(std::move(config)) {}
  bool trivial() const override { return true; }
  // The same device checks as with peers, so that code that runs at world size 1
  // does not first fail at 2.
  std::shared_ptr<PendingWork> all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op) override {
    check_devices("all_reduce", tensors);
    premultiply(tensors, op);
    return done_work(tensors);
  }
  // NCCL's PREMUL_SUM at world size 1: the factor times the one rank's values.
  bool reduces_op(ReduceOp op) const override {
    return op != ReduceOp::PREMUL_SUM || config_->backend == "nccl";
  }
  static void premultiply(std::vector<at::Tensor>& tensors, ReduceOp op) {
    if (op != ReduceOp::PREMUL_SUM) return;
    for (at::Tensor& t : tensors) t.mul_(op.factor());
  }
  std::shared_ptr<PendingWork> broadcast(std::vector<at::Tensor>& tensors, int) override {
    check_devices("broadcast", tensors);
    return done_work(tensors);
  }
  std::shared_ptr<PendingWork> all_gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs) override {
    check_devices("all_gather", inputs);
    for (size_t i = 0; i < inputs.size(); ++i) outputs[i][0].copy_(inputs[i]);
    return done_work(outputs.empty() ? inputs : outputs[0]);
  }
  std::shared_ptr<PendingWork> reduce(std::vector<at::Tensor>& tensors, int, ReduceOp op) override {
    check_devices("reduce", tensors);
    premultiply(tensors, op);
    return done_work(tensors);
  }
  std::shared_ptr<PendingWork> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                      std::vector<at::Tensor>& inputs, int) override {
    check_devices("gather", inputs);
    outputs[0][0].copy_(inputs[0]);
    return done_work(outputs[0]);
  }
  std::shared_ptr<PendingWork> scatter(std::vector<at::Tensor>& outputs,
                                       std::vector<std::vector<at::Tensor>>& inputs, int) override {
    check_devices("scatter", outputs);
    outputs[0].copy_(inputs[0][0]);
    return done_work(outputs);
  }
  std::shared_ptr<PendingWork> reduce_scatter(std::vector<at::Tensor>& outputs,
                                              std::vector<std::vector<at::Tensor>>& inputs,
                                              ReduceOp op) override {
    check_devices("reduce_scatter", inputs[0]);
    outputs[0].copy_(inputs[0][0]);
    premultiply(outputs, op);
    return done_work(outputs);
  }
  std::shared_ptr<PendingWork> all_to_all(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs) override {
    check_devices("all_to_all", inputs);
    outputs[0].copy_(inputs[0]);
    return done_work(outputs);
  }
  std::shared_ptr<PendingWork> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>&,
                                                 std::vector<int64_t>&) override {
    check_devices("all_to_all_single", {input, output});
    output.copy_(input);
    return done_work({output});
  }
  void barrier() override {}
  // Keys of ddp's own checks (monitored_barrier, fingerprints), which then run as with
  // peers: nobody else reads them.
  void store_set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(store_mutex_);
    store_[key] = value;
  }
  std::optional<std::string> store_try_get(const std::string& key) override {
    std::lock_guard<std::mutex> lock(store_mutex_);
    auto it = store_.find(key);
    if (it == store_.end()) return std::nullopt;
    return it->second;
  }
  void shutdown() override {}

 private:
  std::mutex store_mutex_;
  std::map<std::string, std::string> store_;
};

}  // namespace

std::unique_ptr<Comm> make_local_comm(CommConfig config) {
  if (config.local_rank < 0) config.local_rank = 0;
  if (config.local_world_size < 0) config.local_world_size = 1;
  return std::make_unique<LocalComm>(std::move(config));
}

// ---- Devices (Note [Device discipline]) ------------------------------------------------

void Comm::store_set(const std::string& key, const std::string&) {
  TORCH_INTERNAL_ASSERT(false, "this group has no store (key ", key, ")");
}

std::optional<std::string> Comm::store_try_get(const std::string& key) {
  TORCH_INTERNAL_ASSERT(false, "this group has no store (key ", key, ")");
}

c10::Device Comm::device() const {
  if (config_->backend == "nccl") {
    return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(config_->local_rank));
  }
  return c10::Device(c10::DeviceType::CPU);
}

at::Tensor Comm::to_device(const at::Tensor& t) {
  const c10::Device d = device();
  if (d.is_cuda() && t.is_cpu()) {
    // From pinned memory without blocking, as PyTorch's reducer copies its bookkeeping: a
    // pageable copy would synchronise the stream. The caching host allocator keeps the
    // pinned block until the copy is done.
    return t.pin_memory().to(d, /*non_blocking=*/true);
  }
  return t.to(d);
}

at::Tensor Comm::to_host(const at::Tensor& t) { return t.to(c10::Device(c10::DeviceType::CPU)); }

bool Comm::accepts(const c10::Device& d) const {
  // NCCL reads only this rank's GPU; Gloo reduces host memory and CUDA tensors.
  if (config_->backend == "nccl" || config_->backend == "standin") return d == device();
  return d.is_cpu() || d.is_cuda();
}

void Comm::check_devices(const char* what, const std::vector<at::Tensor>& tensors) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) continue;  // the backend names that itself
    const c10::Device d = tensors[i].device();
    if (C10_UNLIKELY(!accepts(d))) {
      DDP_CHECK(false, what, " on ", where(*config_), ": tensor ", i, " is on ", d,
                ", but this group's collectives take tensors on ", device(),
                config_->backend == "nccl"      ? " (the \"nccl\" backend reads only the GPU "
                                                  "of this rank's local rank)"
                : config_->backend == "standin" ? " (like \"nccl\", the \"standin\" backend "
                                                  "reads only this rank's device: a tensor "
                                                  "made on the host must be moved first)"
                                                : "",
                ". Move it first, e.g. t.to(pg.device()).");
    }
    if (C10_UNLIKELY(i > 0 && tensors[0].defined() && d != tensors[0].device())) {
      DDP_CHECK(false, what, " on ", where(*config_), ": tensor ", i, " is on ", d,
                " but tensor 0 is on ", tensors[0].device(),
                "; one collective takes "
                "tensors of one device.");
    }
  }
}

CommFailure classify_comm_failure(const std::string& cause) {
  const std::string t = ascii_lower(cause);
  const bool timeout =
      t.find("timed out") != std::string::npos || t.find("timeout") != std::string::npos;
  return timeout ? CommFailure::kTimeout : CommFailure::kBroken;
}

bool is_unsupported_op(const std::string& cause) {
  // 1.13: "ProcessGroupGloo does not support _reduce_scatter_base", "no support for
  // _allgather_base in Gloo process group".
  const std::string t = ascii_lower(cause);
  return t.find("does not support") != std::string::npos ||
         t.find("no support for") != std::string::npos;
}

void throw_comm_failure(CommFailure kind, const std::string& message) {
  if (kind == CommFailure::kTimeout) throw TimeoutError(message);
  throw ProcessGroupError(message);
}

void rethrow_comm_error(const std::exception& e, const CommConfig& config,
                        const std::string& what) {
  const std::string text = cause_text(e);
  if (dynamic_cast<const TimeoutError*>(&e) || dynamic_cast<const ProcessGroupError*>(&e)) {
    throw;  // already ours
  }
  if (classify_comm_failure(text) == CommFailure::kTimeout) {
    throw TimeoutError(what + " on " + where(config) + " timed out after " +
                       std::to_string(config.timeout.count()) +
                       " ms: a peer did not answer. Check that every rank is alive and "
                       "calls the same collectives in the same order, or raise the "
                       "timeout. Cause: " +
                       text);
  }
  throw ProcessGroupError(what + " on " + where(config) +
                          " failed; the process group is broken (state unknown), destroy "
                          "it and create a new one. Cause: " +
                          text);
}

}  // namespace detail
}  // namespace ddp
