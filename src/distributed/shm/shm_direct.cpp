#include "distributed/shm/shm_direct.h"

#include "distributed/shm/shm_internal.h"
#include "distributed/shm/shm_kernels.h"
#include "distributed/shm/shm_layout.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>

#include <unistd.h>

namespace ddp {
namespace detail {
namespace shm {

// ---- Note [Direct all-reduce] ---------------------------------------------------------

SpanMap::SpanMap(size_t max_spans) {
  spans_.reserve(max_spans);
  starts_.reserve(max_spans + 1);
}

void SpanMap::assign(const SpanEntry* spans, size_t count, size_t esize) {
  spans_.clear();
  starts_.clear();
  esize_ = esize;
  size_t total = 0;
  for (size_t k = 0; k < count; ++k) {
    if (spans[k].count == 0) continue;
    spans_.push_back(spans[k]);
    starts_.push_back(total);
    total += static_cast<size_t>(spans[k].count);
  }
  starts_.push_back(total);
}

size_t SpanMap::pieces(size_t begin, size_t end, struct iovec* out, size_t max) const {
  if (begin >= end) return 0;
  // The span holding `begin`: the last start <= begin.
  size_t k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end() - 1, begin) -
                                 starts_.begin()) -
             1;
  size_t n = 0;
  for (size_t at = begin; at < end && k < spans_.size() && n < max; ++k) {
    const size_t span_end = starts_[k + 1];
    const size_t stop = std::min(end, span_end);
    out[n].iov_base = reinterpret_cast<unsigned char*>(static_cast<uintptr_t>(spans_[k].address)) +
                      (at - starts_[k]) * esize_;
    out[n].iov_len = (stop - at) * esize_;
    ++n;
    at = stop;
  }
  return n;
}

namespace {

template <typename Copy>
int cross_copy(Copy copy, pid_t pid, const struct iovec* local, size_t num_local,
               const struct iovec* remote, size_t num_remote, size_t bytes) {
  if (bytes == 0) return 0;
  const ssize_t done = copy(pid, local, static_cast<unsigned long>(num_local), remote,
                            static_cast<unsigned long>(num_remote), 0);
  if (done < 0) return errno;
  return static_cast<size_t>(done) == bytes ? 0 : EFAULT;
}

}  // namespace

int read_from(pid_t pid, const struct iovec* local, size_t num_local, const struct iovec* remote,
              size_t num_remote, size_t bytes) {
  return cross_copy(::process_vm_readv, pid, local, num_local, remote, num_remote, bytes);
}

int write_to(pid_t pid, const struct iovec* local, size_t num_local, const struct iovec* remote,
             size_t num_remote, size_t bytes) {
  return cross_copy(::process_vm_writev, pid, local, num_local, remote, num_remote, bytes);
}

// A rank's part of the segment for direct all-reduces. Only its owner writes it, except
// `probe`, which its owner writes through a peer's address space (enable_direct).
struct Transport::DirectArea {
  int64_t pid;     // its owner's, as its own pid namespace numbers it
  uint64_t base;   // where its owner mapped the segment
  uint64_t nonce;  // random; a peer that reads it through `base` reached the right process
  std::atomic<uint64_t> probe;
  uint64_t num_spans;  // of the owner's current direct all-reduce
  double scale;        // of the owner's values in it
  uint64_t reserved[2];
  SpanEntry spans[kMaxSpans];
};
Transport::DirectArea& Transport::direct_area(int rank) const {
  static_assert(sizeof(SpanEntry) == 16 && sizeof(DirectArea) == kLine + kMaxSpans * 16,
                "a direct area is one line of header and then the spans");
  return *reinterpret_cast<DirectArea*>(static_cast<unsigned char*>(base_) +
                                        direct_areas_offset(options_.world_size) +
                                        static_cast<size_t>(rank) * direct_area_bytes());
}

bool Transport::enable_direct(bool wanted, std::string* why_not) {
  const int n = options_.world_size;
  const int me = options_.rank;
  DirectArea& mine = direct_area(me);
  std::random_device rd;
  mine.pid = static_cast<int64_t>(::getpid());
  mine.base = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(base_));
  mine.nonce = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) | 1;
  mine.probe.store(0, std::memory_order_relaxed);
  barrier();  // every area is filled in

  // Read each peer's nonce through its own address space, and only then (it is the right
  // process) write a token into this rank's area through it and read it back here.
  std::string reason = wanted ? "" : "turned off (DDP_SHM_CMA=0)";
  for (int k = 0; k < n && reason.empty(); ++k) {
    if (k == me) continue;
    const DirectArea& theirs = direct_area(k);
    const int64_t pid = peer_pids_[static_cast<size_t>(k)];
    const std::string who = "rank " + std::to_string(k) + " (pid " + std::to_string(pid) + ")";
    if (pid <= 0 || pid != theirs.pid) {
      reason = "rank " + std::to_string(k) + " is in another pid namespace";
      break;
    }
    // Where a field of rank `owner`'s area lies in rank k's address space.
    auto in_their_space = [&](int owner, size_t field) {
      return reinterpret_cast<void*>(
          static_cast<uintptr_t>(theirs.base + direct_areas_offset(n) +
                                 static_cast<size_t>(owner) * direct_area_bytes() + field));
    };
    uint64_t got = 0;
    iovec local{&got, sizeof(got)};
    iovec remote{in_their_space(k, offsetof(DirectArea, nonce)), sizeof(got)};
    if (const int err = read_from(static_cast<pid_t>(pid), &local, 1, &remote, 1, sizeof(got))) {
      reason = "process_vm_readv of " + who + " failed: " + errno_text(err) +
               (err == EPERM ? " (the kernel allows it only where ptrace is allowed: Yama's "
                               "ptrace_scope (sysctl kernel.yama.ptrace_scope=0 allows it), a "
                               "seccomp profile or a missing CAP_SYS_PTRACE forbid it; "
                               "DDP_SHM_CMA=0 stops trying)"
                             : "");
      break;
    }
    if (got != theirs.nonce) {
      reason = "process_vm_readv of " + who + " read another process";
      break;
    }
    uint64_t token = mine.nonce ^ (static_cast<uint64_t>(k) << 1);
    local = iovec{&token, sizeof(token)};
    remote.iov_base = in_their_space(me, offsetof(DirectArea, probe));
    if (const int err = write_to(static_cast<pid_t>(pid), &local, 1, &remote, 1, sizeof(token))) {
      reason = "process_vm_writev of " + who + " failed: " + errno_text(err);
      break;
    }
    // The kernel stored it on this thread's behalf, before the call returned.
    if (mine.probe.load(std::memory_order_relaxed) != token) {
      reason = "process_vm_writev of " + who + " did not land";
      break;
    }
  }

  // Everyone learns the lowest rank that could not, and its reason.
  int32_t first_failed = reason.empty() ? INT32_MAX : me;
  all_reduce(&first_failed, 1, DType::kInt32, Op::kMin);
  if (first_failed == INT32_MAX) {
    direct_ = true;
    direct_chunk_ = options_.direct_chunk_bytes;
    if (direct_chunk_ == 0) {
      // Every peer's part of a chunk stays in cache while it is folded in, and each
      // system call moves enough to pay for itself (docs/shm.md: 1 MiB beat 256 KiB by
      // 15-20% at 2 ranks).
      direct_chunk_ =
          std::clamp<size_t>((size_t(1) << 20) / static_cast<size_t>(std::max(1, n - 1)),
                             size_t(64) << 10, size_t(1) << 20);
    }
    direct_chunk_ = std::max(kLine, direct_chunk_ / kLine * kLine);
    scratch_.assign(static_cast<size_t>(n) * direct_chunk_, 0);
    span_maps_.clear();
    for (int r = 0; r < n; ++r) span_maps_.push_back(std::make_unique<SpanMap>(kMaxSpans));
    own_pieces_.resize(kMaxSpans);
    scales_.assign(static_cast<size_t>(n), 1.0);
    peer_pieces_.resize(kMaxSpans);
    return true;
  }
  char text[1024] = {};
  if (first_failed == me) std::snprintf(text, sizeof(text), "%s", reason.c_str());
  broadcast(text, sizeof(text), first_failed);
  if (why_not != nullptr) *why_not = "rank " + std::to_string(first_failed) + ": " + text;
  return false;
}

void Transport::all_reduce_direct(const std::vector<Span>& spans, DType dtype, Op op,
                                  double scale) {
  if (!direct_) {
    throw std::logic_error("all_reduce_direct on a transport whose direct all-reduce is off");
  }
  if (spans.size() > kMaxSpans) {
    throw std::invalid_argument("all_reduce_direct: " + std::to_string(spans.size()) +
                                " spans, but at most " + std::to_string(kMaxSpans));
  }
  if (scale != 1.0 && !(op == Op::kSum && (dtype == DType::kFloat32 || dtype == DType::kFloat64))) {
    throw std::invalid_argument(std::string("all_reduce_direct: a scale needs a float32 or "
                                            "float64 SUM, not ") +
                                dtype_name(dtype) + " " + op_name(op));
  }
  size_t count = 0;
  for (const Span& span : spans) count += span.count;
  run_direct(Call::reduction(Kind::kAllReduceDirect, count, dtype, op), spans, scale);
}

void Transport::fail_cross_copy(int err, int peer, const char* what, const Call& call) {
  const int64_t pid = peer_pids_[static_cast<size_t>(peer)];
  const std::string who = "rank " + std::to_string(peer) + " (pid " + std::to_string(pid) + ")";
  if (err == ESRCH) {
    fail(Error::Kind::kPeerGone,
         who + " has exited while this rank was in " + Call::describe(call.code(), call.bytes) +
             "; the group is broken",
         peer);
  }
  fail(Error::Kind::kSetup,
       std::string("could not ") + what + " the memory of " + who + " in " +
           Call::describe(call.code(), call.bytes) + ": " + errno_text(err) +
           "; the group is broken",
       peer);
}

void Transport::run_direct(const Call& call, const std::vector<Span>& spans, double scale) {
  const int n = options_.world_size;
  const int me = options_.rank;
  const size_t esize = dtype_size(call.dtype);
  // A: this rank's spans. The peers read them during their B, which ends before this
  // rank's next call begins (it waits for every B), so one area per rank suffices.
  DirectArea& area = direct_area(me);
  area.num_spans = spans.size();
  area.scale = scale;
  for (size_t k = 0; k < spans.size(); ++k) {
    area.spans[k] = SpanEntry{static_cast<uint64_t>(reinterpret_cast<uintptr_t>(spans[k].data)),
                              static_cast<uint64_t>(spans[k].count)};
  }
  enter_unit(call);

  // B: partition `me`, chunk by chunk, straight between the ranks' buffers.
  const auto [begin, end] = partition(call.bytes / esize, esize);
  if (begin < end) {
    scaled_ = false;
    for (int r = 0; r < n; ++r) {
      const DirectArea& a = direct_area(r);
      span_maps_[static_cast<size_t>(r)]->assign(a.spans, std::min<size_t>(a.num_spans, kMaxSpans),
                                                 esize);
      scales_[static_cast<size_t>(r)] = a.scale;
      scaled_ = scaled_ || a.scale != 1.0;
    }
    const size_t step = std::max<size_t>(1, direct_chunk_ / esize);
    for (size_t a = begin; a < end; a += step) {
      check_stopped(call, -1);  // a failed peer may have released its buffers: write no more
      reduce_direct_chunk(call, a, std::min(end, a + step));
    }
  }
  // The kernel's copies into the peers' memory are stores made on this thread's behalf
  // before its system calls returned; B is published after them with release order, so
  // a peer that sees B sees them.
  leave_unit(call);
}

void Transport::reduce_direct_chunk(const Call& call, size_t begin, size_t end) {
  const int n = options_.world_size;
  const int me = options_.rank;
  const size_t esize = dtype_size(call.dtype);
  const size_t bytes = (end - begin) * esize;
  for (int k = 0; k < n; ++k) {
    if (k == me) continue;
    const size_t np = span_maps_[static_cast<size_t>(k)]->pieces(begin, end, peer_pieces_.data(),
                                                                 peer_pieces_.size());
    iovec local{scratch_.data() + static_cast<size_t>(k) * direct_chunk_, bytes};
    const auto pid = static_cast<pid_t>(peer_pids_[static_cast<size_t>(k)]);
    if (const int err = read_from(pid, &local, 1, peer_pieces_.data(), np, bytes)) {
      fail_cross_copy(err, k, "read", call);
    }
  }
  const size_t no = span_maps_[static_cast<size_t>(me)]->pieces(begin, end, own_pieces_.data(),
                                                                own_pieces_.size());
  size_t done = 0;
  for (size_t p = 0; p < no; ++p) {
    const size_t count = own_pieces_[p].iov_len / esize;
    for (int r = 0; r < n; ++r) {
      inputs_[static_cast<size_t>(r)] =
          r == me ? own_pieces_[p].iov_base
                  : scratch_.data() + static_cast<size_t>(r) * direct_chunk_ + done * esize;
    }
    if (scaled_) {
      fold_scaled(call.dtype, own_pieces_[p].iov_base, inputs_.data(), n, count, scales_.data());
    } else {
      reduce(call.dtype, call.op, own_pieces_[p].iov_base, nullptr, 0, inputs_.data(), n, 0, count);
    }
    done += count;
  }
  for (int k = 0; k < n; ++k) {
    if (k == me) continue;
    const size_t np = span_maps_[static_cast<size_t>(k)]->pieces(begin, end, peer_pieces_.data(),
                                                                 peer_pieces_.size());
    const auto pid = static_cast<pid_t>(peer_pids_[static_cast<size_t>(k)]);
    if (const int err = write_to(pid, own_pieces_.data(), no, peer_pieces_.data(), np, bytes)) {
      fail_cross_copy(err, k, "write", call);
    }
  }
}

// ---- Note [Direct reduce-scatter and all-gather] (shm_transport.h) ------------------
// fully_shard's flat collectives on the direct all-reduce's machinery: A publishes each
// rank's buffer, B reads the peers' parts, C ends. Nothing is written into a peer: a
// rank only reads, so a peer's buffers are its own again once every rank has published B.

namespace {
// Bytes read from one peer per system call in an all-gather: large enough to pay for
// the call, small enough to notice a failed peer soon.
constexpr size_t kGatherChunk = size_t(4) << 20;
}  // namespace

void Transport::publish_one_span(const void* data, size_t count) {
  DirectArea& area = direct_area(options_.rank);
  area.num_spans = 1;
  area.scale = 1.0;
  area.spans[0] = SpanEntry{static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data)),
                            static_cast<uint64_t>(count)};
}

void Transport::reduce_scatter_direct(const void* input, void* output, size_t count, DType dtype,
                                      Op op) {
  if (!direct_) {
    throw std::logic_error("reduce_scatter_direct on a transport whose direct path is off");
  }
  const int n = options_.world_size;
  const int me = options_.rank;
  const size_t esize = dtype_size(dtype);
  const Call call = Call::reduction(Kind::kReduceScatterDirect, count, dtype, op);
  publish_one_span(input, count * static_cast<size_t>(n));
  enter_unit(call);

  const size_t first = count * static_cast<size_t>(me);
  const size_t step = std::max<size_t>(1, direct_chunk_ / esize);
  auto* out = static_cast<unsigned char*>(output);
  const auto* own = static_cast<const unsigned char*>(input);
  for (size_t a = 0; a < count; a += step) {
    check_stopped(call, -1);
    const size_t len = std::min(count - a, step);
    const size_t bytes = len * esize;
    for (int k = 0; k < n; ++k) {
      if (k == me) {
        inputs_[static_cast<size_t>(k)] = own + (first + a) * esize;
        continue;
      }
      unsigned char* buf = scratch_.data() + static_cast<size_t>(k) * direct_chunk_;
      const DirectArea& theirs = direct_area(k);
      iovec local{buf, bytes};
      iovec remote{reinterpret_cast<unsigned char*>(
                       static_cast<uintptr_t>(theirs.spans[0].address)) +
                       (first + a) * esize,
                   bytes};
      if (const int err = read_from(static_cast<pid_t>(peer_pids_[static_cast<size_t>(k)]), &local,
                                    1, &remote, 1, bytes)) {
        fail_cross_copy(err, k, "read", call);
      }
      inputs_[static_cast<size_t>(k)] = buf;
    }
    reduce(dtype, op, out + a * esize, nullptr, 0, inputs_.data(), n, 0, len);
  }
  leave_unit(call);  // every peer has read this rank's input: it is the caller's again
}

void Transport::all_gather_direct(const void* input, void* output, size_t bytes) {
  if (!direct_) {
    throw std::logic_error("all_gather_direct on a transport whose direct path is off");
  }
  const int n = options_.world_size;
  const int me = options_.rank;
  Call call;
  call.kind = Kind::kAllGatherDirect;
  call.bytes = bytes;
  publish_one_span(input, bytes);
  enter_unit(call);

  auto* out = static_cast<unsigned char*>(output);
  for (int i = 1; i <= n; ++i) {
    const int k = (me + i) % n;  // the ranks read different peers at first
    unsigned char* dst = out + static_cast<size_t>(k) * bytes;
    if (k == me) {
      if (dst != input) std::memmove(dst, input, bytes);
      continue;
    }
    const DirectArea& theirs = direct_area(k);
    auto* src = reinterpret_cast<unsigned char*>(static_cast<uintptr_t>(theirs.spans[0].address));
    for (size_t a = 0; a < bytes; a += kGatherChunk) {
      check_stopped(call, -1);
      const size_t len = std::min(bytes - a, kGatherChunk);
      iovec local{dst + a, len};
      iovec remote{src + a, len};
      if (const int err = read_from(static_cast<pid_t>(peer_pids_[static_cast<size_t>(k)]), &local,
                                    1, &remote, 1, len)) {
        fail_cross_copy(err, k, "read", call);
      }
    }
  }
  leave_unit(call);
}

}  // namespace shm
}  // namespace detail
}  // namespace ddp
