#pragma once

// Process groups: who am I (rank), how many are we (world size), and the collectives
// that connect us. Names follow torch.distributed. The API is in one header per concern:
//   ddp/distributed/options.h        InitOptions, RankInfo, ReduceOp
//   ddp/distributed/work.h           Work, the handle of an asynchronous collective
//   ddp/distributed/process_group.h  ProcessGroup and its collectives (this header)
//   ddp/distributed/default_group.h  init_process_group and the default group's calls
// This header includes the others, so that one include gives the whole API.

#include <ddp/distributed/default_group.h>
#include <ddp/distributed/options.h>
#include <ddp/distributed/work.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

class ProcessGroup;

namespace detail {
class Comm;
/// A group over an already connected Comm (the library's own, or a test double).
std::shared_ptr<ProcessGroup> make_process_group(std::unique_ptr<Comm> comm);
Comm& comm_of(const ProcessGroup& pg);
}  // namespace detail

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

}  // namespace ddp
