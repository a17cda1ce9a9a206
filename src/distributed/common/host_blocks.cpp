#include "distributed/common/host_blocks.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>

#include <algorithm>
#include <tuple>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

namespace ddp {
namespace detail {
namespace {

// Note [Host blocks]
// Each step a fully_shard unit needs an all-gather output, its full parameters and a
// reduce-scatter input, each about the unit's size, and frees them again soon after. On
// a GPU the caching allocator hands the same blocks back. On the CPU a fresh block of
// this size is a fresh mapping whose every page the kernel zeroes at first touch
// (measured: a third of a step's time), and a freed one either goes back to the system
// or, below glibc's mmap threshold, stays in its heap where other sizes fragment it.
//
// So on the CPU these blocks come from a pool of our own mappings:
// - A take is served by the smallest cached block that holds it with little to spare
//   (at most a quarter more), else by a new mapping (rounded up to 64 KiB, or 2 MiB
//   above 32 MiB, with transparent huge pages asked for: one fault per 2 MiB instead of
//   one per 4 KiB).
// - A block returns when its HostBlock is destroyed or reset, which its owner does
//   once the collective that used it was waited for. Not when the last tensor over it
//   dies: a finished collective's tensors are let go by the backend's worker thread a
//   moment after wait() returns (c10d's Gloo worker, our task queue), and counting on
//   that made the pool map one block more now and then. A collective that failed may
//   still write: its blocks are kept for good (keep_for_good).
// - The pool never holds more than the schedule had in use at once: whenever in-use
//   plus cached would exceed the largest in-use figure so far (bound_), cached
//   blocks are unmapped first, the largest first. So caching adds nothing to a step's
//   peak: what it keeps is what the next step needs again.
// - release_host_blocks() unmaps what is cached (ddp::release_free_cpu_memory()).
// Measured on bench/run-fsdp's model in docs/fsdp.md.

constexpr int64_t kSmall = 64 << 10;
constexpr int64_t kHuge = 2 << 20;

int64_t rounded(int64_t bytes) {
  const int64_t step = bytes > (int64_t(32) << 20) ? kHuge : kSmall;
  return (bytes + step - 1) / step * step;
}

class Pool {
 public:
  static Pool& instance() {
    static Pool* pool = new Pool();  // never destroyed: blocks may die at exit
    return *pool;
  }

  /// A block of at least `bytes` bytes: its address and size.
  std::pair<void*, int64_t> take(int64_t bytes, bool tensor) {
    void* data = nullptr;
    int64_t size = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cached_.lower_bound(bytes);
      if (it != cached_.end() && it->first <= bytes + bytes / 4 + kSmall) {
        size = it->first;
        data = it->second;
        cached_.erase(it);
        stats_.cached -= size;
      } else {
        size = rounded(bytes);
        // Make room: in use plus cached stays within the largest in-use figure.
        const int64_t limit = std::max(bound_, used() + size);
        while (!cached_.empty() && used() + stats_.cached + size > limit) {
          auto victim = std::prev(cached_.end());  // the largest: the fewest unmaps
          unmap(victim->second, victim->first);
          stats_.cached -= victim->first;
          cached_.erase(victim);
        }
      }
      (tensor ? stats_.tensors_in_use : stats_.in_use) += size;
      stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
      bound_ = std::max(bound_, used());
    }
    if (!data) data = map(size);
    return {data, size};
  }

  void give(void* data, int64_t size, bool tensor) {
    std::lock_guard<std::mutex> lock(mutex_);
    (tensor ? stats_.tensors_in_use : stats_.in_use) -= size;
    if (used() + stats_.cached + size > bound_) {
      unmap(data, size);
      return;
    }
    cached_.emplace(size, data);
    stats_.cached += size;
  }

  HostBlockStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_in_use = stats_.in_use;
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, data] : cached_) unmap(data, size);
    cached_.clear();
    stats_.cached = 0;
    stats_.peak_in_use = stats_.in_use;
    bound_ = used();
  }

 private:
  void* map(int64_t size) {
    void* p = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(p != MAP_FAILED, "ddp: could not map ", size,
                " bytes of host memory: ", std::strerror(errno),
                ". The host is out of memory (under fully_shard: use more ranks, smaller "
                "units, or reshard_after_forward).");
#ifdef MADV_HUGEPAGE
    if (size >= kHuge) madvise(p, static_cast<size_t>(size), MADV_HUGEPAGE);
#endif
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.maps;
    return p;
  }
  static void unmap(void* data, int64_t size) { munmap(data, static_cast<size_t>(size)); }
  int64_t used() const { return stats_.in_use + stats_.tensors_in_use; }

  std::mutex mutex_;
  std::multimap<int64_t, void*> cached_;  // size -> block
  HostBlockStats stats_;
  int64_t bound_ = 0;  // the largest used() since the start or release(): what may be kept
};

}  // namespace

HostBlock::HostBlock(int64_t bytes, c10::Device device) {
  if (device.is_cpu() && bytes >= kSmall) {
    std::tie(data_, size_) = Pool::instance().take(bytes, /*tensor=*/false);
    // Not owned: the memory is the pool's, given back by reset().
    at::DataPtr ptr(data_, c10::Device(c10::kCPU));
    c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(bytes),
                         std::move(ptr), /*allocator=*/nullptr, /*resizable=*/false);
    tensor_ = at::empty({0}, at::TensorOptions().dtype(at::kByte));
    tensor_.set_(storage, 0, {bytes}, {1});
    return;
  }
  c10::DeviceGuard guard(device);  // allocators allocate on the current device
  tensor_ = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
}

HostBlock& HostBlock::operator=(HostBlock&& other) noexcept {
  if (this != &other) {
    reset();
    tensor_ = std::move(other.tensor_);
    data_ = other.data_;
    size_ = other.size_;
    other.tensor_ = at::Tensor();
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void HostBlock::reset() {
  tensor_ = at::Tensor();
  if (data_) Pool::instance().give(data_, size_, /*tensor=*/false);
  data_ = nullptr;
  size_ = 0;
}

void HostBlock::keep_for_good() {
  tensor_ = at::Tensor();
  data_ = nullptr;  // never unmapped; the pool counts it in use for good
  size_ = 0;
}

std::pair<void*, int64_t> take_host_memory(int64_t bytes) {
  return Pool::instance().take(bytes, /*tensor=*/true);
}

void give_host_memory(void* data, int64_t size) {
  Pool::instance().give(data, size, /*tensor=*/true);
}

HostBlockStats host_block_stats() { return Pool::instance().stats(); }

void release_host_blocks() { Pool::instance().release(); }

void reset_host_block_peak() { Pool::instance().reset_peak(); }

}  // namespace detail
}  // namespace ddp
