#include <ddp/distributed/process_group.h>

#include <ddp/errors.h>

#include "distributed/common/check.h"
#include "distributed/comm.h"
#include "distributed/global_ranks.h"
#include "distributed/rendezvous/rendezvous.h"
#include "distributed/work.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <mutex>

namespace ddp {

// ---- Work ------------------------------------------------------------------------

struct Work::State {
  std::shared_ptr<detail::PendingWork> pending;
};

void Work::wait() {
  DDP_CHECK(state_, "wait() on an empty ddp::Work");
  state_->pending->wait();
}

c10::intrusive_ptr<c10::ivalue::Future> Work::future() {
  DDP_CHECK(state_, "future() on an empty ddp::Work");
  return state_->pending->future();
}

int Work::source_rank() {
  DDP_CHECK(state_, "source_rank() on an empty ddp::Work");
  return state_->pending->source_rank();
}

Work detail::make_work(std::shared_ptr<detail::PendingWork> pending) {
  Work w;
  w.state_ = std::make_shared<Work::State>();
  w.state_->pending = std::move(pending);
  return w;
}

// ---- ProcessGroup ----------------------------------------------------------------

std::shared_ptr<ProcessGroup> detail::make_process_group(std::unique_ptr<Comm> comm) {
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(comm)));
}

std::shared_ptr<ProcessGroup> ProcessGroup::create(const InitOptions& options) {
  return detail::make_process_group(detail::Comm::create(detail::resolve_rendezvous(options)));
}

ProcessGroup::ProcessGroup(std::unique_ptr<detail::Comm> comm) : comm_(std::move(comm)) {
  if (!comm_) return;
  for (int r = 0; r < comm_->config().world_size; ++r) ranks_.push_back(r);
  self_ = comm_->config().rank;
}

ProcessGroup::~ProcessGroup() {
  try {
    shutdown();
  } catch (...) {
    // A destructor must not throw; shutdown of a broken group has nothing to report.
  }
}

detail::Comm& ProcessGroup::comm() const {
  if (!member_) {
    std::string ranks;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      ranks += (i ? ", " : "") + std::to_string(ranks_[i]);
    }
    detail::throw_error(
        c10::str("global rank ", self_, " is not a member of this group (global ranks [", ranks,
                 "]): only its members call its collectives. Check is_member() first, as PyTorch "
                 "code checks for GroupMember.NON_GROUP_MEMBER."));
  }
  DDP_CHECK(comm_, "this process group was shut down (destroy_process_group); create a "
                   "new one with init_process_group before using collectives.");
  return *comm_;
}

int ProcessGroup::rank() const { return member_ ? comm().config().rank : -1; }
int ProcessGroup::size() const {
  return member_ ? comm().config().world_size : static_cast<int>(ranks_.size());
}
bool ProcessGroup::is_member() const { return member_; }
const std::vector<int>& ProcessGroup::ranks() const { return ranks_; }
int ProcessGroup::local_rank() const { return comm().config().local_rank; }
int ProcessGroup::local_world_size() const { return comm().config().local_world_size; }
const std::string& ProcessGroup::backend() const { return comm().config().backend; }
std::chrono::milliseconds ProcessGroup::timeout() const { return comm().config().timeout; }

c10::Device ProcessGroup::device() const { return comm().device(); }

void ProcessGroup::barrier() { comm().barrier(); }

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  DDP_CHECK(tensor.defined(), "all_reduce got an undefined tensor on rank ", rank());
  DDP_CHECK(op != ReduceOp::AVG || at::isFloatingType(tensor.scalar_type()),
            "all_reduce with AVG needs a floating-point tensor, but got ", tensor.scalar_type(),
            " on rank ", rank(), ". Use SUM and divide yourself.");
  std::vector<at::Tensor> tensors{tensor};
  comm().all_reduce(tensors, op == ReduceOp::AVG ? ReduceOp(ReduceOp::SUM) : op)->wait();
  if (op == ReduceOp::AVG && size() > 1) tensor.div_(size());
}

void ProcessGroup::broadcast(at::Tensor& tensor, int src) {
  DDP_CHECK(src >= 0 && src < size(), "broadcast src must be in 0..", size() - 1, ", but got ",
            src);
  std::vector<at::Tensor> tensors{tensor};
  comm().broadcast(tensors, src)->wait();
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  std::vector<at::Tensor> inputs{tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  comm().all_gather(outputs, inputs)->wait();
  return outputs[0];
}

std::vector<std::string> ProcessGroup::all_gather_bytes(const std::string& bytes) {
  // Lengths first, then every rank's bytes padded to the longest.
  const int64_t world = size();
  const at::Tensor lengths =
      detail::all_gather_host(*this, at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong));
  const int64_t* length = lengths.data_ptr<int64_t>();
  const int64_t longest = std::max<int64_t>(*std::max_element(length, length + world), 1);
  at::Tensor host = at::zeros({longest}, at::kByte);
  std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
  const at::Tensor gathered = detail::all_gather_host(*this, host);
  const auto* data = static_cast<const char*>(gathered.data_ptr());
  std::vector<std::string> out;
  for (int64_t r = 0; r < world; ++r) {
    out.emplace_back(data + r * longest, static_cast<size_t>(length[r]));
  }
  return out;
}

void ProcessGroup::reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  DDP_CHECK(op != ReduceOp::AVG || at::isFloatingType(input.scalar_type()),
            "reduce_scatter_tensor with AVG needs a floating-point tensor, but got ",
            input.scalar_type(), " on rank ", rank(), ". Use SUM and divide yourself.");
  at::Tensor in = input;
  comm()
      .reduce_scatter_tensor(output, in, op == ReduceOp::AVG ? ReduceOp(ReduceOp::SUM) : op)
      ->wait();
  if (op == ReduceOp::AVG && size() > 1) output.div_(size());
}

void ProcessGroup::all_gather_into_tensor(at::Tensor& output, const at::Tensor& input) {
  at::Tensor in = input;
  comm().all_gather_into_tensor(output, in)->wait();
}

namespace detail {

Comm& comm_of(const ProcessGroup& pg) { return pg.comm(); }

// Each is the public collective between a move to the group's device and a copy back.
at::Tensor all_reduce_host(ProcessGroup& pg, const at::Tensor& host, ReduceOp op) {
  at::Tensor t = comm_of(pg).to_device(host);
  pg.all_reduce(t, op);
  return comm_of(pg).to_host(t);
}

at::Tensor broadcast_host(ProcessGroup& pg, const at::Tensor& host, int src) {
  at::Tensor t = comm_of(pg).to_device(host);
  pg.broadcast(t, src);
  return comm_of(pg).to_host(t);
}

at::Tensor all_gather_host(ProcessGroup& pg, const at::Tensor& host) {
  std::vector<at::Tensor> rows = pg.all_gather(comm_of(pg).to_device(host.reshape({-1})));
  for (at::Tensor& row : rows) row = comm_of(pg).to_host(row);
  return at::stack(rows);
}

}  // namespace detail

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

Work ProcessGroup::reduce_scatter_tensor_async(at::Tensor& output, at::Tensor& input, ReduceOp op) {
  if (op == ReduceOp::AVG) {
    DDP_CHECK(at::isFloatingType(input.scalar_type()),
              "reduce_scatter_tensor_async with AVG "
              "needs a floating-point tensor, but got ",
              input.scalar_type(), " on rank ", rank(), ".");
    input.div_(size());
    op = ReduceOp::SUM;
  }
  Work w;
  w.state_ = std::make_shared<Work::State>();
  w.state_->pending = comm().reduce_scatter_tensor(output, input, op);
  return w;
}

Work ProcessGroup::all_gather_into_tensor_async(at::Tensor& output, at::Tensor& input) {
  Work w;
  w.state_ = std::make_shared<Work::State>();
  w.state_->pending = comm().all_gather_into_tensor(output, input);
  return w;
}

void ProcessGroup::shutdown() {
  if (!comm_) return;
  comm_->shutdown();
  comm_.reset();
}

bool ProcessGroup::is_shut_down() const { return member_ && comm_ == nullptr; }

// ---- The default group -----------------------------------------------------------

namespace {

std::mutex g_mutex;
std::shared_ptr<ProcessGroup> g_default;

}  // namespace

bool is_nccl_available() { return detail::nccl_compiled(); }
bool is_gloo_available() { return true; }

void init_process_group(const InitOptions& options) {
  std::lock_guard<std::mutex> lock(g_mutex);
  DDP_CHECK(!g_default,
            "init_process_group was called twice: the default process group "
            "(rank ",
            g_default ? g_default->rank() : -1,
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
    DDP_CHECK(g_default, "destroy_process_group called, but no default process group is "
                         "initialised (never initialised, or already destroyed).");
    pg = std::move(g_default);
  }
  pg->shutdown();
}

std::shared_ptr<ProcessGroup> default_group() {
  std::lock_guard<std::mutex> lock(g_mutex);
  DDP_CHECK(g_default, "the default process group is not initialised: call "
                       "ddp::init_process_group() first (and not after destroy_process_group()).");
  return g_default;
}

int get_rank() { return default_group()->rank(); }
int get_world_size() { return default_group()->size(); }
int get_rank(const std::shared_ptr<ProcessGroup>& group) {
  return detail::group_or_default(group)->rank();
}
int get_world_size(const std::shared_ptr<ProcessGroup>& group) {
  const auto g = detail::group_or_default(group);
  return g->is_member() ? g->size() : -1;
}
int get_local_rank() { return default_group()->local_rank(); }
int get_local_world_size() { return default_group()->local_world_size(); }
c10::Device get_device() { return default_group()->device(); }

void barrier(const std::shared_ptr<ProcessGroup>& group) {
  detail::group_or_default(group)->barrier();
}
void all_reduce(at::Tensor& tensor, ReduceOp op, const std::shared_ptr<ProcessGroup>& group) {
  detail::group_or_default(group)->all_reduce(tensor, op);
}
Work all_reduce_async(at::Tensor& tensor, ReduceOp op, const std::shared_ptr<ProcessGroup>& group) {
  std::vector<at::Tensor> one{tensor};
  return detail::group_or_default(group)->all_reduce_async(one, op);
}
void broadcast(at::Tensor& tensor, int src, const std::shared_ptr<ProcessGroup>& group) {
  detail::group_or_default(group)->broadcast(tensor,
                                             detail::group_rank_for(group, src, "ddp::broadcast",
                                                                    "src"));
}
Work broadcast_async(at::Tensor& tensor, int src, const std::shared_ptr<ProcessGroup>& group) {
  std::vector<at::Tensor> one{tensor};
  return detail::group_or_default(group)->broadcast_async(
      one, detail::group_rank_for(group, src, "ddp::broadcast_async", "src"));
}
std::vector<at::Tensor> all_gather(const at::Tensor& tensor) {
  return default_group()->all_gather(tensor);
}
std::vector<std::string> all_gather_bytes(const std::string& bytes) {
  return default_group()->all_gather_bytes(bytes);
}

void reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                           const std::shared_ptr<ProcessGroup>& group) {
  detail::group_or_default(group)->reduce_scatter_tensor(output, input, op);
}
void all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                            const std::shared_ptr<ProcessGroup>& group) {
  detail::group_or_default(group)->all_gather_into_tensor(output, input);
}

ProcessGroupGuard::ProcessGroupGuard(const InitOptions& options) { init_process_group(options); }

ProcessGroupGuard::~ProcessGroupGuard() {
  try {
    if (is_initialized()) destroy_process_group();
  } catch (...) {
  }
}

}  // namespace ddp
