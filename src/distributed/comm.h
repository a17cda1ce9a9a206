#pragma once

// The one internal interface between ddp-cpp and its backends. Everything that names a
// c10d type lives in backends/c10d_comm.cpp (and work.cpp); the LibTorch 1.13 / 2.x
// differences live there too. The rest of the library sees only this header.
// docs/architecture.md draws the layers: process_group.cpp -> TracedComm -> the
// backend's Comm (C10dComm, ShmComm, HierComm, StandinComm, LocalComm).

#include "distributed/store_wait.h"
#include "distributed/work.h"

#include <ddp/distributed/process_group.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddp {
namespace detail {

class RecordSigner;

/// Where and how the ranks meet. Filled in by rendezvous.cpp from InitOptions and the
/// environment, which nothing else in the library reads (docs/environment.md);
/// consumed by Comm::create (backend_select.cpp) and the backends.
struct CommConfig {
  std::string backend;  // "gloo", "nccl", "shm", "standin"; "hier" once made
  // The user left the backend empty on a CPU: Comm::create picks "shm", "hier" or
  // "gloo" (Note [Backend choice]).
  bool backend_auto = false;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // InitOptions::single_rank_group / DDP_SINGLE_RANK_GROUP: at world size 1, a real
  // one-rank group of the backend instead of LocalComm.
  bool single_rank_group = false;

  enum class StoreKind { kNone, kFile, kTcp };
  StoreKind store = StoreKind::kNone;
  std::string store_path;     // kFile
  std::string master_addr;    // kTcp
  int master_port = 0;        // kTcp
  int master_listen_fd = -1;  // kTcp, rank 0: DDP_MASTER_LISTEN_FD (Note [Handed-over port])
  // With a job secret (DDP_SECRET_FILE): every value in the store is signed and checked
  // (Note [Signed store records]); null: plain records.
  std::shared_ptr<const RecordSigner> record_signer;
  std::string init_method;  // for messages

  // Gloo binds its connections here: an interface name, or else an address.
  std::string gloo_interface;
  std::string gloo_address;
  // init_method file://: Comm::create picks the interface (unless GLOO_SOCKET_IFNAME
  // named one) from what the ranks tell each other at the rendezvous (Note [Interface
  // from peers]).
  bool interface_from_peers = false;
  // local_rank and local_world_size, when they are -1, likewise come from the hosts
  // the ranks report (file://, and env:// or tcp:// without LOCAL_RANK).
  bool placement_from_peers = false;

  // Diagnostics (Note [Collective fingerprints], Note [Flight recorder]).
  bool debug_detail = false;              // DDP_DEBUG=detail / InitOptions::debug
  int debug_check_every = 100;            // DDP_DEBUG_CHECK_EVERY: DDP's parameter checksums
  size_t flight_recorder_entries = 2000;  // DDP_FLIGHT_RECORDER_SIZE; 0: off
  std::string flight_recorder_dir;        // DDP_FLIGHT_RECORDER_DIR; empty: no files
  WaitReport wait_report;                 // DDP_WAIT_REPORT (Note [Waiting that talks])

  // The shm backend (docs/shm.md).
  size_t shm_slice_bytes = size_t(512) << 10;  // DDP_SHM_SLICE_BYTES
  size_t shm_direct_chunk_bytes = 0;           // DDP_SHM_CMA_CHUNK_BYTES; 0: the transport's
  bool shm_zero_copy = true;                   // DDP_SHM_ZERO_COPY=0: buckets in private memory
  bool shm_direct = true;                      // DDP_SHM_CMA=0: no reduction in place
};

/// "rank 2 of 4 (gloo, env://)", for messages.
std::string where(const CommConfig& c);

/// A connected group. Collectives take the tensor lists c10d takes.
///
/// Note [Device discipline]
/// Every collective checks that its tensors are on a device the backend reads
/// (check_devices; NCCL: this rank's GPU only), so a violation is an error that names
/// the call instead of a crash inside the backend. Bookkeeping collectives (sizes,
/// orders, counts, bytes) build their tensors on the host, move them with to_device()
/// and read the result only through to_host() after wait(): on NCCL, wait() merely
/// makes the current stream wait for the collective, and the copy to the host is what
/// waits for the data. With Gloo both are the identity.
struct GroupSeed;
class Store;
struct HostIdentity;

class Comm {
 public:
  /// Builds the store and the backend. World size 1 needs neither.
  static std::unique_ptr<Comm> create(const CommConfig& config);
  /// Note [Groups from the parent's store] (backend_select.cpp): the Comm of group `id`
  /// of this one, whose members are `parent_ranks` (ranks of this group, this rank among
  /// them), on `backend` ("" chooses as the note says) with `timeout` (zero: this
  /// group's). Collective over the members only.
  std::unique_ptr<Comm> create_subgroup(const std::vector<int>& parent_ranks, int id,
                                        const std::string& backend,
                                        std::chrono::milliseconds timeout);
  /// The number of the next group made from this one: the same on every rank that makes
  /// its groups in the same order.
  int next_group_id();
  virtual ~Comm() = default;

  const CommConfig& config() const { return *config_; }

  /// Note [World size 1]
  /// A group of one rank gets LocalComm, unless a real one-rank group of the backend is
  /// asked for (CommConfig::single_rank_group). LocalComm owns everything world size 1
  /// means: every collective is the identity (with the same device checks as with
  /// peers) and its store lives in the process, so callers run their usual code. Only
  /// work that exists for the peers' sake and costs time on every step may be skipped
  /// where trivial() says so: DDP's buckets (the reducer's local mode), ZeRO's parameter
  /// broadcast, the buffers' broadcast before forward, and SyncBatchNorm, which is plain
  /// BatchNorm at world size 1 as in PyTorch.
  virtual bool trivial() const { return false; }

  /// Whether all_reduce takes `dtype` natively. False (Gloo, and a hierarchy whose
  /// hosts' leaders use it, with bfloat16): a caller that may choose reduces in a wider
  /// type instead (bf16_compress_hook).
  virtual bool reduces_dtype(c10::ScalarType dtype) const { return true; }
  /// Shared with every PendingWork, which may outlive this Comm.
  const std::shared_ptr<const CommConfig>& shared_config() const { return config_; }

  /// The device bookkeeping tensors travel on: cuda:local_rank for NCCL, else CPU.
  virtual c10::Device device() const;
  /// A copy of host tensor `t` on device() (`t` itself when it is already there).
  virtual at::Tensor to_device(const at::Tensor& t);
  /// A host tensor holding `t`'s values; call only after the collective's wait().
  virtual at::Tensor to_host(const at::Tensor& t);
  /// Throws c10::Error naming `what` unless every tensor is on a device this backend
  /// can read, and all on the same one.
  void check_devices(const char* what, const std::vector<at::Tensor>& tensors) const;

  /// Any op but AVG (done above this layer), on dtypes the caller checked it takes.
  virtual std::shared_ptr<PendingWork> all_reduce(std::vector<at::Tensor>& tensors,
                                                  ReduceOp op) = 0;
  virtual std::shared_ptr<PendingWork> broadcast(std::vector<at::Tensor>& tensors, int src) = 0;
  /// outputs[0][r] receives rank r's inputs[0].
  virtual std::shared_ptr<PendingWork> all_gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs) = 0;
  /// Rank r's `output` receives the reduction (op: SUM, MAX or MIN) of chunk r of
  /// every rank's `input`, which holds world_size equal chunks of output's numel.
  /// Backends without a native one (Gloo in LibTorch 1.13) get the fallback below.
  virtual std::shared_ptr<PendingWork> reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                             ReduceOp op);
  /// reduce_scatter_tensor, where the caller no longer needs `input` (a buffer it
  /// filled for this call): a backend may reduce in it, in place, and leave it changed.
  /// The default keeps it (reduce_scatter_tensor); Gloo's all-reduce path saves the copy.
  virtual std::shared_ptr<PendingWork> reduce_scatter_tensor_scratch(at::Tensor& output,
                                                                     at::Tensor& input,
                                                                     ReduceOp op) {
    return reduce_scatter_tensor(output, input, op);
  }
  /// Chunk r of `output` (world_size chunks of input's numel) receives rank r's
  /// `input`.
  virtual std::shared_ptr<PendingWork> all_gather_into_tensor(at::Tensor& output,
                                                              at::Tensor& input);
  virtual void barrier() = 0;

  // The rest of torch.distributed's collectives (docs/process_groups.md). The caller
  // (ProcessGroup) has checked ranks, list lengths, shapes and dtypes on this rank;
  // every tensor is contiguous unless said otherwise. AVG never reaches these.
  // A backend without its own takes the fallbacks of Note [Collective fallbacks].

  /// Rank `dst`'s tensors[0] receives the reduction; the others' are left unchanged.
  virtual std::shared_ptr<PendingWork> reduce(std::vector<at::Tensor>& tensors, int dst,
                                              ReduceOp op);
  /// On `dst`, outputs[0][r] receives rank r's inputs[0]; elsewhere outputs is empty.
  virtual std::shared_ptr<PendingWork> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                              std::vector<at::Tensor>& inputs, int dst);
  /// outputs[0] receives inputs[0][this rank] of rank `src`; inputs is empty elsewhere.
  virtual std::shared_ptr<PendingWork> scatter(std::vector<at::Tensor>& outputs,
                                               std::vector<std::vector<at::Tensor>>& inputs,
                                               int src);
  /// outputs[0] receives the reduction of inputs[0][this rank] over all ranks.
  virtual std::shared_ptr<PendingWork> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      ReduceOp op);
  /// outputs[r] receives rank r's inputs[this rank]; one dtype, any shapes.
  virtual std::shared_ptr<PendingWork> all_to_all(std::vector<at::Tensor>& outputs,
                                                  std::vector<at::Tensor>& inputs);
  /// Split sizes in rows of dim 0, world_size each (the caller fills in even splits).
  virtual std::shared_ptr<PendingWork> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& output_splits,
                                                         std::vector<int64_t>& input_splits);
  /// Point to point: tensors[0] to rank `dst` (!= this rank).
  virtual std::shared_ptr<PendingWork> send(std::vector<at::Tensor>& tensors, int dst, int tag);
  /// Into tensors[0] from rank `src`, or from any rank when src is kAnySource; the work's
  /// source_rank() names the sender.
  virtual std::shared_ptr<PendingWork> recv(std::vector<at::Tensor>& tensors, int src, int tag);
  static constexpr int kAnySource = -1;
  /// One send or receive of batch_p2p.
  struct P2P {
    bool send = true;
    at::Tensor tensor;  // contiguous
    int peer = 0;
    int tag = 0;
  };
  /// batch_isend_irecv: every op launched before any is waited for, so that the two
  /// sides' orders never deadlock (Gloo's sends and receives do not block the launch;
  /// NCCL's are grouped). One work per op, in order.
  virtual std::vector<std::shared_ptr<PendingWork>> batch_p2p(std::vector<P2P>& ops);
  /// Whether all_reduce and the other reductions take `op` (PREMUL_SUM: NCCL only).
  virtual bool reduces_op(ReduceOp op) const { return op != ReduceOp::PREMUL_SUM; }

  /// Note [Direct all-reduce] (shm_transport.h): whether all_reduce_in_place takes
  /// `num_tensors` CPU tensors of `dtype`, reducing them straight between the ranks'
  /// memory, with no copy in or out. The same answer on every rank of the group. Only
  /// the shm backend, where the kernel lets the ranks read each other's memory.
  virtual bool reduces_in_place(c10::ScalarType dtype, size_t num_tensors) const;
  /// In place, the SUM over ranks of the concatenation of `tensors` (contiguous, on the
  /// CPU, of one dtype; every rank the same number of elements in all), each rank's
  /// values multiplied by `scale` first, with the bits of multiplying them into a
  /// buffer and all-reducing that (DDP's default hook). Only where reduces_in_place.
  virtual std::shared_ptr<PendingWork> all_reduce_in_place(std::vector<at::Tensor>& tensors,
                                                           double scale);

  /// Zero-filled 1-D tensors of numels[i] elements with options[i], for buffers that
  /// this group all-reduces again and again (DDP's buckets). Collective: every rank calls
  /// it with the same arguments, in the same order. The shm backend puts them in memory
  /// that every rank maps, and all-reduces them there without copies (Note [Zero-copy
  /// buffers]); the default makes plain tensors.
  virtual std::vector<at::Tensor> allocate_buffers(const std::vector<int64_t>& numels,
                                                   const std::vector<at::TensorOptions>& options);

  // The rendezvous store, for ddp-cpp's own checks (arrival, monitored_barrier,
  // fingerprints); keys start with "ddp/". A group without peers has none: these throw.
  virtual void store_set(const std::string& key, const std::string& value);
  /// The key's value, or nullopt while it does not exist. Never blocks.
  virtual std::optional<std::string> store_try_get(const std::string& key);

  /// The number of the next monitored_barrier of this group (1, 2, ...).
  uint64_t next_monitored_barrier() { return ++monitored_barriers_; }

  /// Releases the backend. A collective still in flight (a peer never joined it) would
  /// block the release until the timeout; then the backend is left to the process
  /// exit instead, so that shutdown never hangs.
  virtual void shutdown() = 0;

 protected:
  explicit Comm(CommConfig config)
      : config_(std::make_shared<const CommConfig>(std::move(config))) {}
  /// Whether tensors on `device` may be passed to this backend's collectives.
  virtual bool accepts(const c10::Device& device) const;
  /// Note [Flat collective fallbacks]: reduce_scatter_tensor as an all-reduce of a copy
  /// of `input` whose chunk is then copied out, and all_gather_into_tensor as an
  /// all-gather into views of `output`. Correct on any Comm; the all-reduce moves twice
  /// the bytes of a native reduce-scatter.
  /// `in_place`: all-reduce `input` itself (reduce_scatter_tensor_scratch), not a copy.
  std::shared_ptr<PendingWork> reduce_scatter_by_all_reduce(at::Tensor& output, at::Tensor& input,
                                                            ReduceOp op, bool in_place = false);
  std::shared_ptr<PendingWork> all_gather_by_views(at::Tensor& output, at::Tensor& input);
  /// Note [Collective fallbacks] (collective_fallbacks.cpp): the new collectives in terms
  /// of all_reduce, all_gather, broadcast and all_to_all_single, for a backend that lacks
  /// one (Gloo in LibTorch 1.13: reduce_scatter, all_to_all).
  std::shared_ptr<PendingWork> reduce_scatter_by_flat(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      ReduceOp op);
  std::shared_ptr<PendingWork> all_to_all_by_single(std::vector<at::Tensor>& outputs,
                                                    std::vector<at::Tensor>& inputs);
  /// Throws naming `what` unless `whole` is world_size contiguous chunks of `part`'s
  /// numel and dtype, on a device this group reads.
  void check_flat(const char* what, const at::Tensor& whole, const at::Tensor& part) const;
  std::shared_ptr<const CommConfig> config_;

 private:
  friend class GroupSeedAccess;
  uint64_t monitored_barriers_ = 0;
  // The store and the ranks' host identities that made this Comm, for its subgroups;
  // null for LocalComm and for Comms made inside another.
  std::shared_ptr<GroupSeed> seed_;
  int local_group_ids_ = 0;  // next_group_id() without a seed
};

/// Gives a Comm the store and identities it was made from (backend_select.cpp).
class GroupSeedAccess {
 public:
  static void seed(Comm& comm, const std::shared_ptr<Store>& store,
                   const std::vector<HostIdentity>& identities);
};

/// LocalComm (Note [World size 1]); local rank and local world size default to 0 and 1.
std::unique_ptr<Comm> make_local_comm(CommConfig config);

/// The Comm behind a group (throws if it was shut down).
Comm& comm_of(const ProcessGroup& pg);

// Bookkeeping collectives (Note [Device discipline]): `host` is a CPU tensor; it is
// moved to the group's device, the collective runs and is waited for, and the result
// comes back as a new CPU tensor. Identity at world size 1.
at::Tensor all_reduce_host(ProcessGroup& pg, const at::Tensor& host, ReduceOp op);
at::Tensor broadcast_host(ProcessGroup& pg, const at::Tensor& host, int src);
/// Row r of the result is rank r's `host` (1-D, the same numel on every rank).
at::Tensor all_gather_host(ProcessGroup& pg, const at::Tensor& host);

/// Whether this build has the "nccl" backend.
bool nccl_compiled();
/// Whether a CUDA device is visible to LibTorch.
bool cuda_available();
/// Throws ProcessGroupError when the NCCL loaded at run time is not the major.minor
/// version that nccl.h said at compile time (Note [NCCL versions]). A no-op without NCCL.
void check_nccl_runtime(int rank);
/// "compiled 2.30.7, loaded 2.30.7", for messages and tests.
std::string nccl_versions();

/// Note [Classifying c10d failures]
/// c10d reports every failure as a c10::Error (or a future's error text); only the text
/// says whether a peer did not answer in time. This is the one place that reads it:
/// kTimeout becomes ddp::TimeoutError, kBroken ddp::ProcessGroupError.
enum class CommFailure { kTimeout, kBroken };
CommFailure classify_comm_failure(const std::string& cause);

/// A caught exception's text for a "Cause: ..." (c10::Error without its location and
/// backtrace).
std::string cause_text(const std::exception& e);

/// Whether a backend's error says that it does not implement the collective at all
/// (Note [Native flat collectives]).
bool is_unsupported_op(const std::string& cause);

/// Throws TimeoutError for kTimeout, else ProcessGroupError, with `message`.
[[noreturn]] void throw_comm_failure(CommFailure kind, const std::string& message);

/// Turns a c10d exception into ddp's (classify_comm_failure), naming `what` and the
/// rank. ddp's own exceptions pass through unchanged.
[[noreturn]] void rethrow_comm_error(const std::exception& e, const CommConfig& config,
                                     const std::string& what);

}  // namespace detail
}  // namespace ddp
