#pragma once

// The pieces of the direct all-reduce (Note [Direct all-reduce] in shm_transport.h) that
// know nothing of the protocol: where an element range of a span list lies, and the
// cross-memory copies to and from another process (the scaled fold is in shm_kernels.h).
// Plain C++ and POSIX, like the transport.

#include "distributed/shm/shm_transport.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include <sys/types.h>
#include <sys/uio.h>

namespace ddp {
namespace detail {
namespace shm {

/// A list of spans (one rank's buffers, in that rank's address space) seen as one
/// array of elements: element i of the concatenation lies in the span whose range holds i.
class SpanMap {
 public:
  /// Room for `max_spans` spans, reserved once, so that assign() does not allocate.
  explicit SpanMap(size_t max_spans = 0);
  /// `count` spans of `esize`-byte elements; spans of no elements are dropped.
  void assign(const SpanEntry* spans, size_t count, size_t esize);
  /// Writes the pieces of elements [begin, end) to out[0..], at most max (the range
  /// must lie within the spans, and its pieces fit `max`). Returns how many.
  size_t pieces(size_t begin, size_t end, struct iovec* out, size_t max) const;
  /// Elements of all spans together.
  size_t elements() const { return starts_.empty() ? 0 : starts_.back(); }

 private:
  std::vector<SpanEntry> spans_;
  std::vector<size_t> starts_;  // starts_[k]: the first element of span k; back(): the total
  size_t esize_ = 1;
};

/// Copies `bytes` bytes from process `pid`'s `remote` pieces into this process's `local`
/// ones (process_vm_readv), or the other way round (process_vm_writev). Returns 0, or
/// the errno of the failure (EFAULT for a short copy: the other process's memory ended).
int read_from(pid_t pid, const struct iovec* local, size_t num_local, const struct iovec* remote,
              size_t num_remote, size_t bytes);
int write_to(pid_t pid, const struct iovec* local, size_t num_local, const struct iovec* remote,
             size_t num_remote, size_t bytes);

}  // namespace shm
}  // namespace detail
}  // namespace ddp
