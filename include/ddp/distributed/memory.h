#pragma once

// Where a process's host memory is: torch.cuda.memory_allocated and max_memory_allocated
// for the CPU, beside the resident set that the kernel counts and what the C library
// holds freed but not returned. For finding where a step's memory goes (docs/fsdp.md
// shows a fully_shard step's timeline measured with it).
//
// Example:
//   ddp::enable_cpu_allocation_counting();   // once, early: counts from here on
//   ddp::reset_peak_cpu_memory_stats();
//   train_one_step();
//   auto s = ddp::cpu_memory_stats();
//   std::printf("peak %lld MB allocated, %lld MB resident\n", s.peak_allocated >> 20,
//               s.peak_rss >> 20);

#include <cstdint>

namespace ddp {

struct CpuMemoryStats {
  /// Resident set size now (/proc/self/statm): every page the process has touched and
  /// not returned, LibTorch's tensors, the C library's free lists, shared memory it
  /// mapped, code.
  int64_t rss = 0;
  /// The largest rss since the process started or reset_peak_cpu_memory_stats()
  /// (VmHWM); -1 where the kernel does not say.
  int64_t peak_rss = -1;
  /// Bytes of LibTorch CPU storage alive now, counted from
  /// enable_cpu_allocation_counting() on (storage allocated before it is not counted);
  /// -1 while counting is off.
  int64_t allocated = -1;
  /// The largest `allocated` since counting began or the last reset.
  int64_t peak_allocated = -1;
  /// Bytes the C library (glibc's malloc) holds freed in its arenas, not returned to
  /// the system: resident, but in no tensor. -1 where unknown.
  int64_t malloc_free = -1;
  /// ddp-cpp's own reused host buffers (fully_shard's all-gather, full-parameter and
  /// reduce-scatter blocks, mapped outside LibTorch's allocator) in use now, and what
  /// the cache keeps for reuse (of them, and of LibTorch's tensors under
  /// enable_cpu_caching_allocator, which `allocated` counts while they are in use).
  int64_t buffers_in_use = 0;
  int64_t buffers_cached = 0;
  /// The largest buffers_in_use since the start or the last reset.
  int64_t peak_buffers_in_use = 0;
};

/// This process's figures now. Cheap (two small reads of /proc), callable from any thread.
CpuMemoryStats cpu_memory_stats();

/// Counts every LibTorch CPU allocation from now on: installs a counting allocator in
/// front of the current CPU allocator (at a higher priority). Idempotent. Each
/// allocation then costs two atomic updates and one small extra allocation.
void enable_cpu_allocation_counting();
bool cpu_allocation_counting_enabled();

/// LibTorch's CPU tensors of 1 MiB or more come from now on from a cache of reused
/// mappings, as the CUDA caching allocator serves a GPU (Note [The caching CPU
/// allocator]): a training step, which asks for the same sizes every step, gets the same
/// blocks back, with no page faults and no heap fragmentation. The cache never holds more
/// than the largest amount in use at once; release_free_cpu_memory() empties it. Under
/// fully_shard it takes the peak RSS down by what glibc's heap would hold free (docs/fsdp.md,
/// "The memory model"). Process-wide; call it once, early, before the model is built.
/// Idempotent. Returns false (and changes nothing) where the current CPU allocator is not
/// LibTorch's default.
bool enable_cpu_caching_allocator();
bool cpu_caching_allocator_enabled();

/// Starts peak_rss, peak_allocated and peak_buffers_in_use afresh from the current
/// figures. peak_rss restarts only where the kernel allows it (/proc/self/clear_refs);
/// returns false where it could not.
bool reset_peak_cpu_memory_stats();

/// Returns the C library's free memory to the system (glibc's malloc_trim: the pages
/// of freed blocks in the middle of its arenas, which it otherwise keeps), and the
/// reused buffers ddp-cpp keeps (buffers_cached). Returns whether anything was released.
bool release_free_cpu_memory();

}  // namespace ddp
