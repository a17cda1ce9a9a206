#pragma once

// How to join a process group (InitOptions), who this process is (RankInfo), and the
// reduction ops. Names follow torch.distributed.

#include <torch/arg.h>

#include <chrono>
#include <string>

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

}  // namespace ddp
