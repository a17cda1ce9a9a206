#pragma once

// Note [Page faults in the first epoch]
// LibTorch's CPU tensors come from malloc. glibc serves blocks above its mmap threshold
// (128 KiB at start, raised only as such blocks are freed) with a fresh mmap, and gives
// memory at the top of the heap back to the kernel above its trim threshold, so until
// the thresholds have adapted, every activation of every iteration is new memory that
// the kernel must fault in and zero. Measured here on 2 cores with 2 ranks: the whole
// first epoch ran 3-4x slower than the second (40% of the CPU in the kernel).

namespace fashion_mnist {

/// Makes malloc keep freed memory for reuse (glibc: fixed mmap and trim thresholds of
/// 32 MiB and 64 MiB). Call it first thing in main. Without glibc it does nothing.
void keep_freed_memory();

}  // namespace fashion_mnist
