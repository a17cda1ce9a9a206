#include "allocator.h"

#include <cstdlib>  // defines __GLIBC__ where the C library is glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace fashion_mnist {

void keep_freed_memory() {
#if defined(__GLIBC__)
  // 32 MiB is the largest mmap threshold glibc accepts on 64-bit systems; a larger value
  // is refused, and setting the trim threshold alone would then freeze the mmap
  // threshold at 128 KiB (setting either turns off the adjustment of both).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
}

}  // namespace fashion_mnist
