#pragma once

// The layout of a transport's segment (Note [Shared-memory all-reduce] in shm_transport.h):
// what the ranks share there, and where each part lies. Internal to the transport.

#include "distributed/shm/shm_transport.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ddp {
namespace detail {
namespace shm {

constexpr uint64_t kMagic = 0x33306d6873706464ull;  // "ddpshm03"
constexpr size_t kPage = 4096;
constexpr size_t kLine = 64;

// Shared by every rank. Only std::atomic members are written after creation.
struct alignas(kLine) Header {
  uint64_t magic;
  uint32_t world_size;
  uint32_t reserved;
  uint64_t slice_bytes;
  uint64_t total_bytes;
  // 0, or who failed first and why (abort_word, shm_protocol.cpp): set once, by
  // compare-exchange.
  std::atomic<uint64_t> abort;
};

struct alignas(kLine) Control {
  std::atomic<uint32_t> seq;      // phases this rank has published
  std::atomic<uint32_t> waiters;  // peers asleep on seq
  // The collective whose first slice is in slot s: kind, dtype, op and root, and its
  // size. Per slot, because a rank that finished a barrier may already describe its next
  // collective while a peer still checks the barrier's.
  std::atomic<uint64_t> call[2];
  std::atomic<uint64_t> bytes[2];
  std::atomic<uint64_t> offset[2];  // all_reduce_in_pool: where in the pool
};

static_assert(sizeof(Header) <= kLine && sizeof(Control) == kLine, "one cache line each");
static_assert(std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free (address-free across processes)");

inline size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// header | control block per rank | direct area per rank | slots
inline size_t direct_areas_offset(int world_size) {
  return round_up(kLine + kLine * static_cast<size_t>(world_size), kPage);
}

inline size_t direct_area_bytes() { return round_up(kLine + kMaxSpans * sizeof(SpanEntry), kPage); }

inline size_t data_offset(int world_size) {
  return direct_areas_offset(world_size) + static_cast<size_t>(world_size) * direct_area_bytes();
}

inline size_t rounded_slice(size_t slice_bytes) {
  return round_up(std::max<size_t>(slice_bytes, 1), kPage);
}

inline Header& header_of(void* base) { return *static_cast<Header*>(base); }
inline Control& control_of(void* base, int rank) {
  return *reinterpret_cast<Control*>(static_cast<unsigned char*>(base) +
                                     kLine * (1 + static_cast<size_t>(rank)));
}

}  // namespace shm
}  // namespace detail
}  // namespace ddp
