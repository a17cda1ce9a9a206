#pragma once

// The shared-memory transport for ranks on one host (docs/shm.md). Plain C++ and POSIX,
// no LibTorch: buffers are raw bytes, dtypes a small enum. shm_comm.cpp puts the
// Comm interface (tensors, works, futures) on top.
//
// Note [Shared-memory all-reduce]
// One segment per group, made by rank 0 and mapped by every rank (an anonymous memfd:
// Note [Segments without a name] in shm_segment.cpp):
//
//   header | control block per rank | 2 slots x (one input area per rank + one result area)
//
// A collective moves through the slots slice by slice (at most slice_bytes per rank per
// slice), alternating slots, so that a rank may fill slot 1 while a slower one still
// reads slot 0. For each slice, each rank r:
//   A. copies the parts of its slice that the other ranks reduce into its input area of
//      the slot (all but partition r), and publishes A;
//   B. once every rank has published A, reduces partition r of the slice over ranks
//      0, 1, ..., n-1, in that order (its own input read from its own buffer, the
//      others' from their input areas), into the result area and into its own buffer,
//      and publishes B;
//   C. once every rank has published B, copies the other partitions of the result area
//      out, and publishes C.
// So each rank moves 2(n-1)/n of the slice through the segment, not 2 whole copies.
// A slot is filled again only after every rank published C for its previous slice. Each
// element is reduced by exactly one rank, always in rank order, so every rank ends with
// the same bits, run after run (Note [Summation order] in docs/shm.md).
//
// Publishing is one counter per rank, increased by one per phase (release), which the
// others wait for (acquire): a short spin, then a futex wait with a short timeout,
// checking between waits the group's deadline, an abort flag that any failing rank
// raises, and whether the peer's process still exists. So a dead or stuck peer ends in
// an error within the timeout, never a hang.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <sys/uio.h>

namespace ddp {
namespace detail {
namespace shm {

enum class DType : uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64 };
enum class Op : uint8_t { kSum, kMax, kMin };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* op_name(Op op);

/// Why a collective failed. kTimeout: the deadline passed; kPeerGone: a peer's process
/// no longer exists; kAborted: another rank failed first (or this group was shut down);
/// kMismatch: the ranks called different collectives; kSetup: the segment could not be
/// made or mapped.
class Error : public std::runtime_error {
 public:
  enum class Kind { kTimeout, kPeerGone, kAborted, kMismatch, kSetup };
  Error(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

/// Note [Zero-copy buffers]
/// Memory that every rank of a group maps: `bytes_per_rank` bytes per rank, rank r's part
/// at part(r). A tensor that lives in a pool (DDP's bucket buffers on the shm backend) is
/// all-reduced in place there: rank r reduces partition r over every rank's part, in rank
/// order, and writes the result into every rank's part. No copy in or out, and no slices:
/// each rank reads and writes each byte of its partition once per rank.
class SharedPool {
 public:
  /// Rank 0: a new segment of world_size * bytes_per_rank bytes, all pages reserved
  /// (zero-filled). Throws Error(kSetup) saying why.
  /// `named`: as Transport::create.
  static std::shared_ptr<SharedPool> create(const std::string& name, int world_size,
                                            size_t bytes_per_rank, uint32_t id, bool named = false);
  /// The other ranks: maps the pool rank 0 created, reached through its where(). Throws
  /// Error(kSetup).
  static std::shared_ptr<SharedPool> open(const std::string& where, int world_size,
                                          size_t bytes_per_rank, uint32_t id);
  ~SharedPool();
  SharedPool(const SharedPool&) = delete;
  SharedPool& operator=(const SharedPool&) = delete;

  /// Rank 0, once every rank mapped it: closes the descriptor that the others opened it
  /// through, or removes the name from /dev/shm. Idempotent.
  void unlink();
  unsigned char* part(int rank) const {
    return static_cast<unsigned char*>(base_) + static_cast<size_t>(rank) * bytes_per_rank_;
  }
  size_t bytes_per_rank() const { return bytes_per_rank_; }
  /// The same on every rank; named in the collective's description, so that ranks that
  /// all-reduce different pools are a mismatch.
  uint32_t id() const { return id_; }
  const std::string& name() const { return name_; }
  /// What the other ranks pass to open().
  const std::string& where() const { return where_; }

 private:
  SharedPool(std::string name, void* base, size_t bytes, size_t bytes_per_rank, uint32_t id);
  std::string name_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  size_t bytes_per_rank_ = 0;
  uint32_t id_ = 0;
  bool linked_ = false;  // as Transport's
  int fd_ = -1;
  std::string where_;
};

/// Note [Direct all-reduce]
/// DDP's gradients live in each rank's private memory. Copying them into shared memory,
/// reducing there and copying the result back moves every byte three times, and on a
/// CPU each pass is bound by the memory bandwidth that the ranks share with backward.
/// Linux lets a process read and write another's memory in one copy, the kernel's
/// (cross-memory attach: process_vm_readv / process_vm_writev), when it may ptrace it:
/// the same user, and no Yama or seccomp policy against it. So a direct all-reduce works
/// on each rank's own buffers, described by their addresses (spans):
///   A. each rank writes its spans into its area of the segment and publishes A;
///   B. once every rank has, rank r reduces partition r of the concatenation, chunk by
///      chunk: it reads each peer's part of the chunk into a small buffer that stays in
///      cache (readv), folds every rank's values in rank order into its own buffer, and
///      writes the result into every peer's buffer (writev); then it publishes B;
///   C. once every rank has published B, every buffer holds the whole result.
/// Each rank moves each byte of its partition once per peer, and no byte goes through
/// the segment. The fold is the same as the other paths' (rank order, one rank per
/// element), so every rank ends with the same bits, and the same bits as the other paths.
/// Each rank's scale (DDP's 1/world_size, or under ddp::join 1/ranks still training, and
/// anything for the zeros of a rank that shadows) is applied to its values before the
/// sum, as DDP's scaled copy into a bucket does, rounding the same way: the ranks publish
/// their scales with their spans.
/// A peer writes into this rank's buffers between this rank's A and its own B; a rank
/// leaves the call only once every peer has published B, so its buffers are never
/// written after it returns. A rank that fails instead stops writing at its next chunk
/// (it checks the abort word before each), and the caller keeps the buffers of a failed
/// call alive for good (shm_comm.cpp), since a stuck peer may still be inside a write.
/// Whether every rank may read and write every other one is probed once, at setup
/// (enable_direct), and agreed by all; where not, calls take the other paths.
struct Span {
  void* data = nullptr;
  size_t count = 0;  // elements
};
/// A span as published in the segment, in its owner's address space.
struct SpanEntry {
  uint64_t address = 0;
  uint64_t count = 0;
};
/// The most spans of one direct all-reduce (a chunk's pieces fit one system call).
constexpr size_t kMaxSpans = 1024;

class SpanMap;  // shm_direct.h

struct Options {
  int rank = 0;
  int world_size = 1;
  /// Bytes per rank per slice (rounded up to 4 KiB). The segment holds
  /// 2 * (world_size + 1) slices.
  size_t slice_bytes = size_t(512) << 10;
  /// Each collective fails with kTimeout after waiting this long for its peers.
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  /// Bytes per chunk of a direct all-reduce, per peer (0: chosen from the world size).
  size_t direct_chunk_bytes = 0;
};

/// Bytes of the segment for `options`.
size_t segment_bytes(const Options& options);

class Transport {
 public:
  /// Rank 0: creates a segment, private to this user (0600), with all its pages
  /// reserved, so that a lack of memory is an error here and not a SIGBUS later. It is an
  /// anonymous memfd that the other ranks open through /proc (Note [Segments without a
  /// name]), or, with `named` (ranks in other pid namespaces), `name` ("/ddp-...") in
  /// /dev/shm. Throws Error(kSetup) saying why.
  static std::unique_ptr<Transport> create(const std::string& name, const Options& options,
                                           bool named = false);
  /// The other ranks: maps the segment rank 0 created, reached through its where().
  /// Throws Error(kSetup).
  static std::unique_ptr<Transport> open(const std::string& where, const Options& options);
  /// A fresh run-unique name: "/ddp-<uid>-<pid>-<16 random hex digits>".
  static std::string unique_name();

  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  /// Rank 0, once every rank has mapped the segment: closes the descriptor that the others
  /// opened it through, or removes the name from /dev/shm; the memory lives on until the
  /// last rank unmaps it. Idempotent.
  void unlink();
  /// Records `pid` as rank `peer`'s process, checked while waiting for it; 0 or a pid of
  /// another pid namespace: not checked (the timeout still holds).
  void set_peer_pid(int peer, int64_t pid);

  /// In place over `count` elements at `data`.
  void all_reduce(void* data, size_t count, DType dtype, Op op);
  /// In place over `count` elements at `offset` bytes into every rank's part of `pool`
  /// (Note [Zero-copy buffers]). Every rank must pass the same pool, offset and count.
  void all_reduce_in_pool(const SharedPool& pool, size_t offset, size_t count, DType dtype, Op op);
  /// Collective: probes whether every rank can read and write every other rank's memory
  /// (Note [Direct all-reduce]); `wanted` false votes no. Every rank gets the same
  /// answer; on false, *why_not says which rank could not, and why. Peers must have
  /// their pids set (set_peer_pid), in this process's pid namespace.
  bool enable_direct(bool wanted, std::string* why_not);
  bool direct() const { return direct_; }
  /// In place over the concatenation of `spans` (this rank's own memory; every rank the
  /// same number of elements, split into spans as it likes), through the peers' memory
  /// (Note [Direct all-reduce]). `scale` multiplies this rank's values before the sum
  /// (float32 and float64 SUM only; else it must be 1). Needs direct() and at most
  /// kMaxSpans spans.
  void all_reduce_direct(const std::vector<Span>& spans, DType dtype, Op op, double scale = 1.0);
  /// Note [Direct reduce-scatter and all-gather]: `output` (count elements, this rank's
  /// own memory) receives partition `rank` of the reduction of every rank's `input`
  /// (world_size * count elements): this rank reads that partition of each peer's input
  /// straight from its memory, chunk by chunk, and folds every rank's values in rank
  /// order (the bits of the direct all-reduce's partition). `output` may be this rank's
  /// own partition of `input`. Needs direct().
  void reduce_scatter_direct(const void* input, void* output, size_t count, DType dtype, Op op);
  /// Part r of `output` (world_size * bytes, this rank's memory) receives rank r's
  /// `input` (bytes), read straight from its memory: one copy per byte. Needs direct().
  void all_gather_direct(const void* input, void* output, size_t bytes);
  /// In place: every rank ends with root's `bytes` bytes.
  void broadcast(void* data, size_t bytes, int root);
  /// outputs[r] receives rank r's `bytes` bytes from `input`.
  void all_gather(const void* input, size_t bytes, const std::vector<void*>& outputs);
  void barrier();

  /// Makes every wait of every rank of this group fail with kAborted (set after a
  /// failure, so that peers stop at once instead of at their timeout). `local_only`:
  /// only this process's waits (shutdown).
  void abort(bool local_only = false);

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const std::string& name() const { return name_; }
  /// What the other ranks pass to open().
  const std::string& where() const { return where_; }

 private:
  struct Layout;
  Transport(std::string name, const Options& options, void* base, size_t bytes);
  void init_header();
  struct Call;
  void run(const Call& call);
  void begin_call();
  // A collective of three phases that uses a slot only for its description (pool and
  // direct all-reduces): enter_unit publishes A and waits for every rank's, leave_unit
  // publishes B, waits for every rank's and publishes C.
  void enter_unit(const Call& call);
  void leave_unit(const Call& call);
  /// This rank's elements [first, second) of `elems`, each partition whole cache lines.
  std::pair<size_t, size_t> partition(size_t elems, size_t esize) const;
  void run_in_pool(const Call& call);
  void run_direct(const Call& call, const std::vector<Span>& spans, double scale);
  void reduce_direct_chunk(const Call& call, size_t begin, size_t end);
  /// A: publishes one span of this rank's memory for the peers to read.
  void publish_one_span(const void* data, size_t count);
  [[noreturn]] void fail_cross_copy(int err, int peer, const char* what, const Call& call);
  struct DirectArea;
  DirectArea& direct_area(int rank) const;
  void publish();
  void wait_all(uint32_t target, const Call& call, const char* phase);
  void wait_one(int peer, uint32_t target, const Call& call, const char* phase);
  void check_same_call(const Call& call, int slot);
  [[noreturn]] void fail(Error::Kind kind, const std::string& message, int peer = -1);
  /// Throws when the group was stopped (another rank failed) or this process shut it
  /// down, while this rank was in `call` (waiting for rank `waiting_for`, or -1).
  void check_stopped(const Call& call, int waiting_for);
  /// The group's abort word was set by another rank while this one was in `call`.
  [[noreturn]] void fail_stopped(uint64_t word, const Call& call);
  void raise_abort(Error::Kind kind, int peer, bool local_only);
  std::string abort_cause(uint64_t word) const;
  unsigned char* input_area(int slot, int rank) const;
  unsigned char* result_area(int slot) const;

  std::string name_;
  Options options_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  bool linked_ = false;  // rank 0's named segment, until unlink()
  int fd_ = -1;          // rank 0's memfd, until unlink()
  std::string where_;
  uint32_t step_ = 0;    // phases published by this rank so far
  uint64_t slices_ = 0;  // slices run so far (selects the slot)
  std::vector<int64_t> peer_pids_;
  std::vector<const void*> inputs_;  // one per rank, reused by every reduction
  std::vector<void*> copies_;        // where a reduced partition also goes
  std::chrono::steady_clock::time_point deadline_;
  // abort(local_only): read by this rank's waits only.
  std::unique_ptr<std::atomic<bool>> local_abort_;
  // Note [Direct all-reduce]; sized once by enable_direct.
  bool direct_ = false;
  size_t direct_chunk_ = 0;             // elements per chunk are direct_chunk_ / element size
  std::vector<unsigned char> scratch_;  // one chunk per rank
  std::vector<double> scales_;          // per rank, this call's
  bool scaled_ = false;                 // some rank's scale is not 1
  std::vector<std::unique_ptr<SpanMap>> span_maps_;  // per rank, this call's spans
  std::vector<iovec> own_pieces_, peer_pieces_;
};

}  // namespace shm
}  // namespace detail
}  // namespace ddp
