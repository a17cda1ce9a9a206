#pragma once

// What the transport's source files share besides the segment's layout (shm_layout.h)
// and the reduction kernels (shm_kernels.h): the description of a collective
// (Transport::Call) and small helpers. Internal to the transport.

#include "distributed/shm/shm_transport.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace ddp {
namespace detail {
namespace shm {

inline std::string errno_text(int err) { return std::strerror(err); }

enum class Kind : uint8_t {
  kAllReduce = 1,
  kBroadcast,
  kAllGather,
  kBarrier,
  kAllReduceInPool,
  kAllReduceDirect,
  kReduceScatterDirect,
  kAllGatherDirect
};

inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kBarrier:
      return "barrier";
    case Kind::kAllReduceInPool:
      return "all_reduce of a shared buffer";
    case Kind::kAllReduceDirect:
      return "all_reduce of private buffers";
    case Kind::kReduceScatterDirect:
      return "reduce_scatter of private buffers";
    case Kind::kAllGatherDirect:
      return "all_gather of private buffers";
  }
  return "?";
}

struct Transport::Call {
  Kind kind = Kind::kBarrier;
  DType dtype = DType::kFloat32;
  Op op = Op::kSum;
  int root = 0;
  size_t bytes = 0;   // per rank
  size_t offset = 0;  // kAllReduceInPool: into each rank's part of the pool
  const SharedPool* pool = nullptr;
  void* data = nullptr;
  const void* input = nullptr;
  const std::vector<void*>* outputs = nullptr;

  static Call reduction(Kind kind, size_t count, DType dtype, Op op) {
    Call call;
    call.kind = kind;
    call.dtype = dtype;
    call.op = op;
    call.bytes = count * dtype_size(dtype);
    return call;
  }

  // kAllReduceInPool: the pool's id where the root goes.
  uint64_t code() const {
    const uint32_t high = kind == Kind::kAllReduceInPool ? pool->id() : static_cast<uint32_t>(root);
    return static_cast<uint64_t>(kind) | static_cast<uint64_t>(dtype) << 8 |
           static_cast<uint64_t>(op) << 16 | static_cast<uint64_t>(high) << 32;
  }
  static std::string describe(uint64_t code, uint64_t bytes, uint64_t offset = 0) {
    const auto kind = static_cast<Kind>(code & 0xFF);
    std::ostringstream os;
    os << kind_name(kind);
    if (kind == Kind::kAllReduce || kind == Kind::kAllReduceDirect ||
        kind == Kind::kReduceScatterDirect) {
      os << " (" << dtype_name(static_cast<DType>((code >> 8) & 0xFF)) << ", "
         << op_name(static_cast<Op>((code >> 16) & 0xFF)) << ", " << bytes << " bytes)";
    } else if (kind == Kind::kAllReduceInPool) {
      os << " (" << dtype_name(static_cast<DType>((code >> 8) & 0xFF)) << ", "
         << op_name(static_cast<Op>((code >> 16) & 0xFF)) << ", " << bytes << " bytes at " << offset
         << " in pool " << (code >> 32) << ")";
    } else if (kind == Kind::kBroadcast) {
      os << " (from rank " << static_cast<int32_t>(code >> 32) << ", " << bytes << " bytes)";
    } else if (kind == Kind::kAllGather || kind == Kind::kAllGatherDirect) {
      os << " (" << bytes << " bytes per rank)";
    }
    return os.str();
  }
};

}  // namespace shm
}  // namespace detail
}  // namespace ddp
