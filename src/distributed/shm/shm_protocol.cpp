#include "distributed/shm/shm_transport.h"

#include "distributed/shm/shm_internal.h"
#include "distributed/shm/shm_layout.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <fstream>

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ddp {
namespace detail {
namespace shm {
namespace {

using Clock = std::chrono::steady_clock;

// How long a wait spins before it sleeps in the kernel: long enough to catch a peer
// that is a few microseconds behind, short enough not to take a core from backward.
constexpr auto kSpin = std::chrono::microseconds(30);
// The longest single sleep: deadlines, aborts and dead peers are noticed this often.
constexpr auto kNap = std::chrono::milliseconds(20);
// How often a waiting rank asks whether its peer's process still exists.
constexpr auto kLivenessEvery = std::chrono::milliseconds(100);

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Futexes on a MAP_SHARED mapping: the non-private operations, which key on the page.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool reached(uint32_t seq, uint32_t target) { return static_cast<int32_t>(seq - target) >= 0; }

// Whether process `pid` is gone: no such process, or a zombie not yet reaped.
bool process_gone(int64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() &&
         (text[paren + 2] == 'Z' || text[paren + 2] == 'X');
}

// The abort word: which rank failed first, how, and which peer it was waiting for.
uint64_t abort_word(int rank, Error::Kind kind, int peer) {
  return uint64_t(1) << 63 | static_cast<uint64_t>(kind) << 48 |
         static_cast<uint64_t>((peer + 1) & 0xFFFF) << 32 | static_cast<uint32_t>(rank);
}

}  // namespace

void Transport::set_peer_pid(int peer, int64_t pid) {
  peer_pids_.at(static_cast<size_t>(peer)) = pid;
}

std::string Transport::abort_cause(uint64_t word) const {
  const int rank = static_cast<int>(word & 0xFFFFFFFFu);
  const auto kind = static_cast<Error::Kind>((word >> 48) & 0x7FFF);
  const int peer = static_cast<int>((word >> 32) & 0xFFFF) - 1;
  const std::string who = "rank " + std::to_string(rank);
  const std::string p = "rank " + std::to_string(peer);
  switch (kind) {
    case Error::Kind::kPeerGone: {
      const int64_t pid = peer >= 0 ? peer_pids_[static_cast<size_t>(peer)] : 0;
      return p + (pid > 0 ? " (pid " + std::to_string(pid) + ")" : std::string()) +
             " has exited (seen by " + who + ")";
    }
    case Error::Kind::kTimeout:
      return who + " gave up waiting for " + p + " at its deadline";
    case Error::Kind::kMismatch:
      return who + " found that the ranks called different collectives";
    case Error::Kind::kSetup:
      return who + " could not read or write the memory of " + p;
    default:
      return who + " was shut down with a collective in flight";
  }
}

void Transport::abort(bool local_only) { raise_abort(Error::Kind::kAborted, -1, local_only); }

void Transport::raise_abort(Error::Kind kind, int peer, bool local_only) {
  local_abort_->store(true, std::memory_order_release);
  if (!local_only) {
    uint64_t none = 0;
    header_of(base_).abort.compare_exchange_strong(none, abort_word(options_.rank, kind, peer),
                                                   std::memory_order_acq_rel);
  }
  for (int r = 0; r < options_.world_size; ++r) futex_wake_all(&control_of(base_, r).seq);
}

void Transport::check_stopped(const Call& call, int waiting_for) {
  if (const uint64_t aborted = header_of(base_).abort.load(std::memory_order_acquire)) {
    fail_stopped(aborted, call);
  }
  if (local_abort_->load(std::memory_order_acquire)) {
    fail(Error::Kind::kAborted,
         "this process group was shut down while " + Call::describe(call.code(), call.bytes) +
             (waiting_for >= 0 ? " was still waiting for rank " + std::to_string(waiting_for)
                               : std::string(" was in flight")));
  }
}

void Transport::fail_stopped(uint64_t word, const Call& call) {
  // A peer that gave up at its deadline stops this rank's call for the same reason: the
  // rank it waited for did not come in time, which is a timeout here too.
  const auto kind = static_cast<Error::Kind>((word >> 48) & 0x7FFF);
  if (kind == Error::Kind::kTimeout) {
    fail(Error::Kind::kTimeout, Call::describe(call.code(), call.bytes) +
                                    " timed out: " + abort_cause(word) + "; the group is broken");
  }
  fail(Error::Kind::kAborted, "the group was stopped while this rank was in " +
                                  Call::describe(call.code(), call.bytes) + ": " +
                                  abort_cause(word) + "; the group is broken");
}

void Transport::fail(Error::Kind kind, const std::string& message, int peer) {
  // Stop the peers too, unless this failure is already their doing.
  if (kind != Error::Kind::kAborted) raise_abort(kind, peer, /*local_only=*/false);
  throw Error(kind, message);
}

void Transport::publish() {
  Control& c = control_of(base_, options_.rank);
  ++step_;
  // seq_cst store then seq_cst load of waiters, against the waiter's seq_cst increment
  // of waiters then load of seq: one of the two sees the other, so no wake-up is lost.
  c.seq.store(step_, std::memory_order_seq_cst);
  if (c.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&c.seq);
}

void Transport::wait_one(int peer, uint32_t target, const Call& call, const char* phase) {
  Control& c = control_of(base_, peer);
  if (reached(c.seq.load(std::memory_order_acquire), target)) return;
  const auto spin_end = Clock::now() + kSpin;
  do {
    for (int i = 0; i < 64; ++i) {
      cpu_relax();
      if (reached(c.seq.load(std::memory_order_acquire), target)) return;
    }
  } while (Clock::now() < spin_end);

  auto next_liveness = Clock::now();
  for (;;) {
    const auto now = Clock::now();
    check_stopped(call, peer);
    if (now >= deadline_) {
      fail(Error::Kind::kTimeout,
           Call::describe(call.code(), call.bytes) + " timed out after " +
               std::to_string(options_.timeout.count()) + " ms waiting for rank " +
               std::to_string(peer) + " (phase " + phase + "): rank " + std::to_string(peer) +
               " did not take part in time. Check that every rank is alive and calls the same "
               "collectives in the same order, or raise the timeout",
           peer);
    }
    const int64_t pid = peer_pids_[static_cast<size_t>(peer)];
    if (pid > 0 && now >= next_liveness) {
      next_liveness = now + kLivenessEvery;
      if (process_gone(pid)) {
        fail(Error::Kind::kPeerGone,
             "rank " + std::to_string(peer) + " (pid " + std::to_string(pid) +
                 ") has exited while this rank was in " + Call::describe(call.code(), call.bytes) +
                 "; the group is broken",
             peer);
      }
    }
    c.waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = c.seq.load(std::memory_order_seq_cst);
    if (!reached(seen, target)) {
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline_ - now);
      futex_wait(&c.seq, seen,
                 std::min<std::chrono::nanoseconds>(kNap, std::max(left, std::chrono::nanoseconds(
                                                                             1000))));
    }
    c.waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(c.seq.load(std::memory_order_acquire), target)) return;
  }
}

void Transport::wait_all(uint32_t target, const Call& call, const char* phase) {
  for (int r = 0; r < options_.world_size; ++r) {
    if (r != options_.rank) wait_one(r, target, call, phase);
  }
}

void Transport::check_same_call(const Call& call, int slot) {
  const uint64_t code = call.code();
  for (int r = 0; r < options_.world_size; ++r) {
    if (r == options_.rank) continue;
    Control& c = control_of(base_, r);
    const uint64_t theirs = c.call[slot].load(std::memory_order_relaxed);
    const uint64_t their_bytes = c.bytes[slot].load(std::memory_order_relaxed);
    const uint64_t their_offset = c.offset[slot].load(std::memory_order_relaxed);
    if (theirs != code || their_bytes != call.bytes || their_offset != call.offset) {
      fail(Error::Kind::kMismatch,
           "the ranks called different collectives: this rank called " +
               Call::describe(code, call.bytes, call.offset) + ", but rank " + std::to_string(r) +
               " called " + Call::describe(theirs, their_bytes, their_offset) +
               ". Every rank must call the same collectives, in the same order, with the same "
               "sizes",
           r);
    }
  }
}

void Transport::begin_call() {
  deadline_ = Clock::now() + options_.timeout;
  if (const uint64_t aborted = header_of(base_).abort.load(std::memory_order_acquire)) {
    throw Error(Error::Kind::kAborted, "an earlier collective of this group failed: " +
                                           abort_cause(aborted) + "; the group is broken");
  }
  if (local_abort_->load(std::memory_order_acquire)) {
    throw Error(Error::Kind::kAborted, "this process group was shut down");
  }
}

}  // namespace shm
}  // namespace detail
}  // namespace ddp
