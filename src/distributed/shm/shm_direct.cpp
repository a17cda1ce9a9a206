#include "distributed/shm/shm_direct.h"

#include <algorithm>
#include <cerrno>

namespace ddp {
namespace detail {
namespace shm {

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

template <typename T>
void fold_scaled_typed(T* out, const void* const* in_v, int n, size_t count, const double* scales) {
  // Two roundings per term, as the bucket path's scaled copy and then its sum (this file
  // is built without contracting them into a fused multiply-add).
  if (n == 2) {  // the common case, in one pass
    const T* a = static_cast<const T*>(in_v[0]);
    const T* b = static_cast<const T*>(in_v[1]);
    const T sa = static_cast<T>(scales[0]);
    const T sb = static_cast<T>(scales[1]);
    for (size_t i = 0; i < count; ++i) {
      const T x = a[i] * sa;
      const T y = b[i] * sb;
      out[i] = x + y;
    }
    return;
  }
  constexpr size_t kBlock = 1024;
  T acc[kBlock];
  for (size_t b = 0; b < count; b += kBlock) {
    const size_t m = std::min(kBlock, count - b);
    const T* s0 = static_cast<const T*>(in_v[0]) + b;
    const T scale0 = static_cast<T>(scales[0]);
    for (size_t i = 0; i < m; ++i) acc[i] = s0[i] * scale0;
    for (int k = 1; k < n; ++k) {
      const T* sk = static_cast<const T*>(in_v[k]) + b;
      const T scale = static_cast<T>(scales[k]);
      for (size_t i = 0; i < m; ++i) {
        const T scaled = sk[i] * scale;
        acc[i] = acc[i] + scaled;
      }
    }
    std::copy(acc, acc + m, out + b);
  }
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

void fold_scaled(DType dtype, void* out, const void* const* in, int n, size_t count,
                 const double* scales) {
  if (dtype == DType::kFloat64) {
    fold_scaled_typed(static_cast<double*>(out), in, n, count, scales);
  } else {
    fold_scaled_typed(static_cast<float*>(out), in, n, count, scales);
  }
}

}  // namespace shm
}  // namespace detail
}  // namespace ddp
