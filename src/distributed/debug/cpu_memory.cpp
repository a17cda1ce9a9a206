#include <ddp/distributed/memory.h>

#include "distributed/common/host_blocks.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace ddp {
namespace {

std::atomic<int64_t> g_allocated{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_counting{false};

void raise_peak(int64_t now) {
  int64_t seen = g_peak.load(std::memory_order_relaxed);
  while (now > seen && !g_peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

// Note [The counting CPU allocator]
// LibTorch's kernels also call raw_allocate, which wants a "simple" DataPtr: context ==
// data, freed by raw_deleter() from the data pointer alone. So what a free needs (the
// size asked for, and where the block came from and its size) lives in a header of
// kHeader bytes (LibTorch's CPU alignment) before the data. The allocator is never
// removed (storages keep a pointer to it for resizing), so it is never destroyed,
// installed once for counting, caching or both. It declares allocate() both const
// (LibTorch 1.13's signature) and not (2.x's): each overrides the one its LibTorch
// declares; copy_data (2.x's, pure there) is a plain method in 1.13.
//
// Note [The caching CPU allocator]
// With enable_cpu_caching_allocator(), a tensor of kCacheMin bytes or more comes from
// the pool of reused mappings that fully_shard's own buffers use (Note [Host blocks]),
// as the CUDA caching allocator serves a GPU: a training step asks for the same sizes
// every time (a unit's full gradients from autograd, the optimizer's temporaries), and
// gets the same blocks back, with no page faults and no glibc heap between them.
// Without it, glibc serves these sizes from its heap (above its mmap threshold, which
// rises to the largest block freed so far): persistent state allocated between
// temporaries splits its free space, and the heap grows step after step (measured on
// bench/run-fsdp's model: 150 to 400 MB held free, varying run to run).
constexpr size_t kHeader = 64;
constexpr size_t kCacheMin = size_t(1) << 20;

std::atomic<bool> g_caching{false};

struct Header {
  int64_t bytes;       // asked for
  int64_t pool_bytes;  // the pool block's size; 0: the inner allocator's
};
static_assert(sizeof(Header) <= kHeader, "the header fits before the data");

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner)
      : inner_(inner), inner_free_(inner->raw_deleter()) {}

  bool usable() const { return inner_free_ != nullptr; }

  c10::DataPtr allocate(size_t n) const { return counted(n); }
  c10::DataPtr allocate(size_t n) { return counted(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    if (count > 0) std::memcpy(dest, src, count);
  }

  static CountingAllocator* self;

 private:
  static void release(void* data) {
    if (!data) return;
    char* base = static_cast<char*>(data) - kHeader;
    Header h{};
    std::memcpy(&h, base, sizeof h);
    g_allocated.fetch_sub(h.bytes, std::memory_order_relaxed);
    if (h.pool_bytes > 0) {
      detail::give_host_memory(base, h.pool_bytes);
    } else {
      self->inner_free_(base);
    }
  }
  c10::DataPtr counted(size_t n) const {
    Header h{static_cast<int64_t>(n), 0};
    char* base = nullptr;
    if (g_caching.load(std::memory_order_relaxed) && n >= kCacheMin) {
      auto [data, size] = detail::take_host_memory(static_cast<int64_t>(n + kHeader));
      base = static_cast<char*>(data);
      h.pool_bytes = size;
    } else {
      base = static_cast<char*>(inner_->raw_allocate(n + kHeader));
    }
    std::memcpy(base, &h, sizeof h);
    raise_peak(g_allocated.fetch_add(h.bytes, std::memory_order_relaxed) + h.bytes);
    void* data = base + kHeader;
    return c10::DataPtr(data, data, &release, c10::Device(c10::DeviceType::CPU));
  }

  c10::Allocator* inner_;
  c10::DeleterFnPtr inner_free_;
};
CountingAllocator* CountingAllocator::self = nullptr;

/// Installs the allocator once; false where the current one cannot be wrapped.
bool install_allocator() {
  static std::once_flag once;
  static bool installed = false;
  std::call_once(once, [] {
    // Never destroyed: tensors freed at exit, after static destructors, still call it.
    auto* allocator = new CountingAllocator(c10::GetCPUAllocator());
    // An allocator whose blocks cannot be freed from their address alone cannot be
    // wrapped (not LibTorch's default).
    if (!allocator->usable()) return;
    CountingAllocator::self = allocator;
    // Above the default CPU allocator's priority (0) and any a program set before.
    c10::SetAllocator(c10::DeviceType::CPU, allocator, /*priority=*/100);
    installed = true;
  });
  return installed;
}

int64_t read_statm_rss() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

int64_t read_hwm() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int64_t kb = -1;
  while (std::fgets(line, sizeof line, f)) {
    long long v = 0;
    if (std::sscanf(line, "VmHWM: %lld kB", &v) == 1) {
      kb = v;
      break;
    }
  }
  std::fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

}  // namespace

CpuMemoryStats cpu_memory_stats() {
  CpuMemoryStats s;
  s.rss = read_statm_rss();
  s.peak_rss = read_hwm();
  if (g_counting.load()) {
    s.allocated = g_allocated.load(std::memory_order_relaxed);
    s.peak_allocated = g_peak.load(std::memory_order_relaxed);
  }
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 mi = mallinfo2();
  s.malloc_free = static_cast<int64_t>(mi.fordblks);
#endif
  const detail::HostBlockStats blocks = detail::host_block_stats();
  s.buffers_in_use = blocks.in_use;
  s.buffers_cached = blocks.cached;
  s.peak_buffers_in_use = blocks.peak_in_use;
  return s;
}

void enable_cpu_allocation_counting() {
  // Counting starts here: what was allocated before is not counted (its frees neither,
  // since they go through the allocator that made it).
  if (install_allocator()) g_counting.store(true);
}

bool enable_cpu_caching_allocator() {
  if (!install_allocator()) return false;
  g_caching.store(true);
  return true;
}

bool cpu_caching_allocator_enabled() { return g_caching.load(); }

bool cpu_allocation_counting_enabled() { return g_counting.load(); }

bool reset_peak_cpu_memory_stats() {
  g_peak.store(g_allocated.load(std::memory_order_relaxed), std::memory_order_relaxed);
  detail::reset_host_block_peak();
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

bool release_free_cpu_memory() {
  const bool cached = detail::host_block_stats().cached > 0;
  detail::release_host_blocks();
#if defined(__GLIBC__)
  return (malloc_trim(0) != 0) || cached;
#else
  return cached;
#endif
}

}  // namespace ddp
