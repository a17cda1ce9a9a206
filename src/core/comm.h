#pragma once

// The one internal interface between ddp-cpp and c10d. Everything that names a c10d
// type lives in c10d_comm.cpp; the LibTorch 1.13 / 2.x differences live there too.
// The rest of the library sees only this header.

#include <ddp/process_group.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace ddp {
namespace detail {

/// Where and how the ranks meet. Filled in by rendezvous.cpp from InitOptions and the
/// environment; consumed by Comm::create.
struct CommConfig {
  std::string backend;          // "gloo" or "nccl"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::chrono::milliseconds timeout = kDefaultTimeout;

  enum class StoreKind { kNone, kFile, kTcp };
  StoreKind store = StoreKind::kNone;
  std::string store_path;       // kFile
  std::string master_addr;      // kTcp
  int master_port = 0;          // kTcp
  std::string init_method;      // for messages

  // Gloo binds its connections here: an interface name, or else an address.
  std::string gloo_interface;
  std::string gloo_address;
};

/// One asynchronous collective in flight.
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  virtual void wait() = 0;
  virtual c10::intrusive_ptr<c10::ivalue::Future> future() = 0;
};

/// A connected group. Collectives take the tensor lists c10d takes.
class Comm {
 public:
  /// Builds the store and the backend. World size 1 needs neither.
  static std::unique_ptr<Comm> create(const CommConfig& config);
  virtual ~Comm() = default;

  const CommConfig& config() const { return config_; }

  /// op is SUM, MAX or MIN (AVG is done above this layer).
  virtual std::shared_ptr<PendingWork> all_reduce(std::vector<at::Tensor>& tensors,
                                                  ReduceOp op) = 0;
  virtual std::shared_ptr<PendingWork> broadcast(std::vector<at::Tensor>& tensors,
                                                 int src) = 0;
  /// outputs[0][r] receives rank r's inputs[0].
  virtual std::shared_ptr<PendingWork> all_gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs) = 0;
  virtual void barrier() = 0;
  virtual void shutdown() = 0;

 protected:
  explicit Comm(CommConfig config) : config_(std::move(config)) {}
  CommConfig config_;
};

/// Whether this build has the "nccl" backend.
bool nccl_compiled();
/// Whether a CUDA device is visible to LibTorch.
bool cuda_available();
/// Throws ProcessGroupError when the NCCL loaded at run time is not the major.minor
/// version that nccl.h said at compile time (Note [NCCL versions]). A no-op without NCCL.
void check_nccl_runtime(int rank);
/// "compiled 2.30.7, loaded 2.30.7", for messages and tests.
std::string nccl_versions();

/// Turns a c10d exception into ddp's: TimeoutError when the text says it timed out,
/// ProcessGroupError otherwise. `what` names the operation, for the message.
[[noreturn]] void rethrow_comm_error(const std::exception& e, const CommConfig& config,
                                     const std::string& what);

} // namespace detail
} // namespace ddp
