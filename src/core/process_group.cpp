#include <ddp/process_group.h>

#include <ddp/errors.h>

#include "core/comm.h"
#include "core/env.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <mutex>

namespace ddp {

// ---- Work ------------------------------------------------------------------------

struct Work::State {
  std::shared_ptr<detail::PendingWork> pending;
};

void Work::wait() {
  TORCH_CHECK(state_, "wait() on an empty ddp::Work");
  state_->pending->wait();
}

c10::intrusive_ptr<c10::ivalue::Future> Work::future() {
  TORCH_CHECK(state_, "future() on an empty ddp::Work");
  return state_->pending->future();
}

// ---- ProcessGroup ----------------------------------------------------------------

std::shared_ptr<ProcessGroup> ProcessGroup::create(const InitOptions& options) {
  detail::CommConfig config = detail::resolve_rendezvous(options);
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(detail::Comm::create(config)));
}

ProcessGroup::ProcessGroup(std::unique_ptr<detail::Comm> comm) : comm_(std::move(comm)) {}

ProcessGroup::~ProcessGroup() {
  try {
    shutdown();
  } catch (...) {
    // A destructor must not throw; shutdown of a broken group has nothing to report.
  }
}

detail::Comm& ProcessGroup::comm() const {
  TORCH_CHECK(comm_, "this process group was shut down (destroy_process_group); create a "
              "new one with init_process_group before using collectives.");
  return *comm_;
}

int ProcessGroup::rank() const { return comm().config().rank; }
int ProcessGroup::size() const { return comm().config().world_size; }
int ProcessGroup::local_rank() const { return comm().config().local_rank; }
int ProcessGroup::local_world_size() const { return comm().config().local_world_size; }
const std::string& ProcessGroup::backend() const { return comm().config().backend; }
std::chrono::milliseconds ProcessGroup::timeout() const { return comm().config().timeout; }

c10::Device ProcessGroup::device() const {
  if (backend() == "nccl") {
    return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(local_rank()));
  }
  return c10::Device(c10::DeviceType::CPU);
}

void ProcessGroup::barrier() { comm().barrier(); }

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  TORCH_CHECK(tensor.defined(), "all_reduce got an undefined tensor on rank ", rank());
  TORCH_CHECK(op != ReduceOp::AVG || at::isFloatingType(tensor.scalar_type()),
              "all_reduce with AVG needs a floating-point tensor, but got ",
              tensor.scalar_type(), " on rank ", rank(), ". Use SUM and divide yourself.");
  if (size() == 1) return;
  std::vector<at::Tensor> tensors{tensor};
  comm().all_reduce(tensors, op == ReduceOp::AVG ? ReduceOp::SUM : op)->wait();
  if (op == ReduceOp::AVG) tensor.div_(size());
}

void ProcessGroup::broadcast(at::Tensor& tensor, int src) {
  TORCH_CHECK(src >= 0 && src < size(), "broadcast src must be in 0..", size() - 1,
              ", but got ", src);
  if (size() == 1) return;
  std::vector<at::Tensor> tensors{tensor};
  comm().broadcast(tensors, src)->wait();
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  if (size() == 1) return {tensor.clone()};
  std::vector<at::Tensor> inputs{tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  comm().all_gather(outputs, inputs)->wait();
  return outputs[0];
}

std::vector<std::string> ProcessGroup::all_gather_bytes(const std::string& bytes) {
  if (size() == 1) return {bytes};
  // Lengths first, then everyone pads to the longest.
  auto len = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  auto lengths = all_gather(len);
  int64_t longest = 0;
  for (const auto& l : lengths) longest = std::max(longest, l.item<int64_t>());
  auto buf = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
  std::memcpy(buf.data_ptr(), bytes.data(), bytes.size());
  auto gathered = all_gather(buf);
  std::vector<std::string> out;
  for (size_t r = 0; r < gathered.size(); ++r) {
    const auto* p = static_cast<const char*>(gathered[r].data_ptr());
    out.emplace_back(p, static_cast<size_t>(lengths[r].item<int64_t>()));
  }
  return out;
}

Work ProcessGroup::all_reduce_async(std::vector<at::Tensor>& tensors, ReduceOp op) {
  if (op == ReduceOp::AVG) {
    // Divide first, as PyTorch's default DDP hook does, so the future's value is final.
    for (auto& t : tensors) t.div_(size());
    op = ReduceOp::SUM;
  }
  Work w;
  w.state_ = std::make_shared<Work::State>();
  w.state_->pending = comm().all_reduce(tensors, op);
  return w;
}

Work ProcessGroup::broadcast_async(std::vector<at::Tensor>& tensors, int src) {
  Work w;
  w.state_ = std::make_shared<Work::State>();
  w.state_->pending = comm().broadcast(tensors, src);
  return w;
}

void ProcessGroup::shutdown() {
  if (!comm_) return;
  comm_->shutdown();
  comm_.reset();
}

bool ProcessGroup::is_shut_down() const { return comm_ == nullptr; }

// ---- The default group -----------------------------------------------------------

namespace {

std::mutex g_mutex;
std::shared_ptr<ProcessGroup> g_default;

} // namespace

bool is_nccl_available() { return detail::nccl_compiled(); }
bool is_gloo_available() { return true; }

void init_process_group(const InitOptions& options) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(!g_default, "init_process_group was called twice: the default process group "
              "(rank ", g_default ? g_default->rank() : -1,
              ") is already initialised. Call destroy_process_group first, or use "
              "ddp::ProcessGroup::create for a second group.");
  g_default = ProcessGroup::create(options);
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_default != nullptr;
}

void destroy_process_group() {
  std::shared_ptr<ProcessGroup> pg;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    TORCH_CHECK(g_default, "destroy_process_group called, but no default process group is "
                "initialised (never initialised, or already destroyed).");
    pg = std::move(g_default);
  }
  pg->shutdown();
}

std::shared_ptr<ProcessGroup> default_group() {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(g_default, "the default process group is not initialised: call "
              "ddp::init_process_group() first (and not after destroy_process_group()).");
  return g_default;
}

int get_rank() { return default_group()->rank(); }
int get_world_size() { return default_group()->size(); }
int get_local_rank() { return default_group()->local_rank(); }
int get_local_world_size() { return default_group()->local_world_size(); }
c10::Device get_device() { return default_group()->device(); }

void barrier() { default_group()->barrier(); }
void all_reduce(at::Tensor& tensor, ReduceOp op) { default_group()->all_reduce(tensor, op); }
void broadcast(at::Tensor& tensor, int src) { default_group()->broadcast(tensor, src); }
std::vector<at::Tensor> all_gather(const at::Tensor& tensor) {
  return default_group()->all_gather(tensor);
}
std::vector<std::string> all_gather_bytes(const std::string& bytes) {
  return default_group()->all_gather_bytes(bytes);
}

ProcessGroupGuard::ProcessGroupGuard(const InitOptions& options) {
  init_process_group(options);
}

ProcessGroupGuard::~ProcessGroupGuard() {
  try {
    if (is_initialized()) destroy_process_group();
  } catch (...) {
  }
}

} // namespace ddp
