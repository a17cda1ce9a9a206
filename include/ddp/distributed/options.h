#pragma once

// How to join a process group (InitOptions), who this process is (RankInfo), and the
// reduction ops. Names follow torch.distributed.

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace ddp {

/// torch.distributed.ReduceOp: how a reduction combines the ranks' values.
///   SUM, PRODUCT, MIN, MAX   every dtype
///   AVG                      floating dtypes; the sum divided by the world size
///   BAND, BOR, BXOR          bitwise and, or, xor: integral and bool dtypes only
///   PREMUL_SUM               each rank's values times factor(), then summed; made with
///                            ReduceOp::premul_sum(factor); only where the backend has
///                            it ("nccl"), refused elsewhere
/// A ReduceOp converts to its Kind, so `op == ReduceOp::SUM` and `switch (op)` work as
/// with a plain enum.
class ReduceOp {
 public:
  enum Kind : uint8_t { SUM, AVG, MAX, MIN, PRODUCT, BAND, BOR, BXOR, PREMUL_SUM };
  // Implicit, so that ReduceOp::MAX is a ReduceOp.
  ReduceOp(Kind kind = SUM) : kind_(kind) {}  // NOLINT(google-explicit-constructor)
  /// torch.distributed._make_nccl_premul_sum(factor).
  static ReduceOp premul_sum(double factor) {
    ReduceOp op(PREMUL_SUM);
    op.factor_ = factor;
    op.has_factor_ = true;
    return op;
  }
  Kind kind() const { return kind_; }
  operator Kind() const { return kind_; }  // NOLINT(google-explicit-constructor)
  /// PREMUL_SUM's factor (set by premul_sum; a bare PREMUL_SUM has none).
  double factor() const { return factor_; }
  bool has_factor() const { return has_factor_; }

 private:
  Kind kind_;
  double factor_ = 1.0;
  bool has_factor_ = false;
};

/// "SUM", "BXOR", ..., for messages.
const char* reduce_op_name(ReduceOp op);

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
