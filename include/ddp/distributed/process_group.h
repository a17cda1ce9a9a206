#pragma once

// Process groups: who am I (rank), how many are we (world size), and the collectives
// that connect us. Names follow torch.distributed.
//
// Example:
//   ddp::init_process_group(ddp::InitOptions().backend("gloo"));   // reads the env
//   torch::Tensor t = torch::ones({4}) * ddp::get_rank();
//   ddp::all_reduce(t, ddp::ReduceOp::AVG);
//   ddp::destroy_process_group();

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

enum class ReduceOp { SUM, AVG, MAX, MIN };

/// PyTorch's default collective timeout.
constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(30);

/// How to join a process group.
///
/// Example:
///   ddp::InitOptions().backend("gloo").init_method("file:///tmp/rdzv/store")
///       .rank(0).world_size(2).timeout(std::chrono::seconds(60));
struct InitOptions {
  /// "gloo" (CPU tensors, CUDA tensors too), "nccl" (CUDA) or "shm" (CPU tensors, every
  /// rank on one host). Empty: "nccl" where LibTorch has CUDA and a GPU is visible; on
  /// CPUs "shm" when every rank shares this host, else "gloo" (or "hier", shared memory
  /// within hosts and Gloo between them). With DDP_DEVICE_STANDIN=1, empty and "nccl"
  /// give "standin": NCCL's rules on a stand-in device, for checks (docs/gpu.md).
  TORCH_ARG(std::string, backend) = "";
  /// "env://" reads torchrun's variables (falling back to Slurm's and Open MPI's);
  /// "tcp://host:port" and "file:///path" need rank and world_size (set here or in
  /// the environment).
  TORCH_ARG(std::string, init_method) = "env://";
  /// This process's rank; -1 takes it from the environment.
  TORCH_ARG(int, rank) = -1;
  /// Number of processes; -1 takes it from the environment.
  TORCH_ARG(int, world_size) = -1;
  /// Rank within this host (selects the GPU); -1 takes it from the environment, else
  /// equals rank on a single host.
  TORCH_ARG(int, local_rank) = -1;
  /// Limit for rendezvous and for each collective.
  TORCH_ARG(std::chrono::milliseconds, timeout) = kDefaultTimeout;
  /// "detail": before every collective, check across ranks that all make the same call
  /// (op, dtypes, shapes, root), and name the rank that differs; slow. "off": no check.
  /// Empty: the DDP_DEBUG environment variable, else PyTorch's TORCH_DISTRIBUTED_DEBUG
  /// (DETAIL is "detail"; OFF and INFO are "off"), else "off". See docs/debugging.md.
  TORCH_ARG(std::string, debug) = "";
  /// For checks: at world size 1, connect a real one-rank group of the backend (NCCL,
  /// Gloo or shm) instead of the shortcut whose collectives do nothing, so that DDP's
  /// buckets and comm hooks, SyncBatchNorm, ZeRO and barriers go through the backend
  /// as they do with peers. Also the DDP_SINGLE_RANK_GROUP=1 environment variable. No
  /// effect at larger world sizes. See docs/gpu.md.
  TORCH_ARG(bool, single_rank_group) = false;
};

/// Who this process is, as read from the environment (torchrun, Slurm or Open MPI).
struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  /// Which launcher's variables were read: "torchrun", "slurm", "openmpi" or "none".
  std::string source = "none";
};

/// Reads RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE, else SLURM_PROCID/SLURM_NTASKS/
/// SLURM_LOCALID, else OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK}. Throws on negative,
/// non-numeric or inconsistent values, naming the variable.
RankInfo rank_info_from_env();

class ProcessGroup;

namespace detail {
class Comm;
/// A group over an already connected Comm (the library's own, or a test double).
std::shared_ptr<ProcessGroup> make_process_group(std::unique_ptr<Comm> comm);
Comm& comm_of(const ProcessGroup& pg);
}  // namespace detail

/// A handle to an asynchronous collective.
class Work {
 public:
  /// Blocks until done. Throws TimeoutError or ProcessGroupError.
  void wait();
  /// A future that completes with the collective's output tensors.
  c10::intrusive_ptr<c10::ivalue::Future> future();

 private:
  friend class ProcessGroup;
  struct State;
  std::shared_ptr<State> state_;
};

/// A group of processes that run collectives together. Create one with
/// init_process_group (the default group) or ProcessGroup::create (an explicit one,
/// used for several groups per process, e.g. one per thread in tests).
class ProcessGroup {
 public:
  static std::shared_ptr<ProcessGroup> create(const InitOptions& options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  int local_rank() const;
  int local_world_size() const;
  /// The backend in use: "gloo", "nccl", "shm" (one host), "hier" (shared memory within
  /// hosts, Gloo between them) or "standin" (DDP_DEVICE_STANDIN); an empty
  /// InitOptions::backend is resolved here.
  const std::string& backend() const;
  std::chrono::milliseconds timeout() const;
  /// The device this rank computes on: cuda:local_rank for "nccl", standin:local_rank
  /// for "standin", else CPU.
  c10::Device device() const;

  void barrier();
  /// A barrier that names who is late: rank 0 waits up to `timeout` for every rank and
  /// throws TimeoutError naming those that did not arrive; the others throw it too,
  /// naming the same ranks (or rank 0, if it never answers). Uses the rendezvous store,
  /// not the backend, so it works while a backend collective is stuck.
  void monitored_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks = true);
  /// In place. AVG divides the sum by size().
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM);
  /// In place: every rank ends with src's tensor.
  void broadcast(at::Tensor& tensor, int src = 0);
  /// Every rank's tensor (same shape and dtype everywhere), in rank order.
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
  /// Every rank's bytes (any length), in rank order.
  std::vector<std::string> all_gather_bytes(const std::string& bytes);
  /// torch.distributed.reduce_scatter_tensor: `input` holds size() equal chunks of
  /// output's numel; rank r's `output` receives the reduction of every rank's chunk r.
  /// AVG divides by size(). `input` is left as it was.
  void reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                             ReduceOp op = ReduceOp::SUM);
  /// torch.distributed.all_gather_into_tensor: chunk r of `output` (size() chunks of
  /// input's numel, contiguous) receives rank r's `input`.
  void all_gather_into_tensor(at::Tensor& output, const at::Tensor& input);

  /// Launches an all-reduce and returns at once; the tensors are reduced in place
  /// (AVG divides on completion). For DDP's buckets and comm hooks.
  Work all_reduce_async(std::vector<at::Tensor>& tensors, ReduceOp op = ReduceOp::SUM);
  Work broadcast_async(std::vector<at::Tensor>& tensors, int src = 0);
  /// reduce_scatter_tensor, launched; the future yields [output]. AVG divides `input`
  /// first (in place), as all_reduce_async does.
  Work reduce_scatter_tensor_async(at::Tensor& output, at::Tensor& input,
                                   ReduceOp op = ReduceOp::SUM);
  /// all_gather_into_tensor, launched; the future yields [output].
  Work all_gather_into_tensor_async(at::Tensor& output, at::Tensor& input);

  /// Releases the connections. Further calls throw. Called by the destructor.
  void shutdown();
  bool is_shut_down() const;

 private:
  friend std::shared_ptr<ProcessGroup> detail::make_process_group(
      std::unique_ptr<detail::Comm> comm);
  friend detail::Comm& detail::comm_of(const ProcessGroup& pg);
  explicit ProcessGroup(std::unique_ptr<detail::Comm> comm);
  detail::Comm& comm() const;
  std::unique_ptr<detail::Comm> comm_;
};

// ---- The default group, as in torch.distributed ----------------------------------

/// Whether this build has the "nccl" backend (LibTorch with CUDA and NCCL).
bool is_nccl_available();
/// Always true: Gloo is part of every LibTorch with c10d.
bool is_gloo_available();

/// Joins the default group. Throws if it is already initialised.
void init_process_group(const InitOptions& options = InitOptions());
bool is_initialized();
/// Releases the default group. Throws if none is initialised.
void destroy_process_group();
/// The default group. Throws if none is initialised.
std::shared_ptr<ProcessGroup> default_group();

int get_rank();
int get_world_size();
int get_local_rank();
int get_local_world_size();
/// The device to move the model to (lesson step 4): cuda:local_rank under "nccl".
c10::Device get_device();

void barrier();
/// ProcessGroup::monitored_barrier on the default group, with its timeout.
void monitored_barrier();
/// ProcessGroup::monitored_barrier on the default group.
void monitored_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks = true);
void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM);
void broadcast(at::Tensor& tensor, int src = 0);
std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
std::vector<std::string> all_gather_bytes(const std::string& bytes);
void reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                           ReduceOp op = ReduceOp::SUM);
void all_gather_into_tensor(at::Tensor& output, const at::Tensor& input);

/// Initialises the default group on construction and destroys it at scope exit, also
/// when an exception unwinds, so no peer is left waiting for a rank that is gone.
class ProcessGroupGuard {
 public:
  explicit ProcessGroupGuard(const InitOptions& options = InitOptions());
  ~ProcessGroupGuard();
  ProcessGroupGuard(const ProcessGroupGuard&) = delete;
  ProcessGroupGuard& operator=(const ProcessGroupGuard&) = delete;
};

}  // namespace ddp
