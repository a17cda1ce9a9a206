#pragma once

// Which parameters share a bucket. Pure: no tensors, no communication, so every rank
// computes the same assignment from the same inputs.
//
// Note [Bucket order]
// Buckets are launched strictly in bucket order, the same on every rank, because
// collectives must be issued in the same order everywhere. A bucket is launched once
// all its gradients and all earlier buckets are ready, so buckets should follow the
// order in which gradients become ready. Before the first backward that order is
// unknown and reverse parameter order is the guess (layers registered first run first
// in forward, so their gradients come last). After the first iteration the real order
// is known and the buckets are rebuilt from it (rank 0's order, broadcast, so all ranks
// agree). The first bucket is kept small so that communication starts early.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp {
namespace detail {

struct ParamSpec {
  int64_t numel = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

using BucketAssignment = std::vector<std::vector<size_t>>;

/// Visits params in `order` (a permutation of 0..params.size()-1) and groups them into
/// buckets of one dtype and device each. The bucket being filled for a (dtype, device)
/// is closed once its bytes reach its cap: first_cap_bytes for the first bucket closed,
/// cap_bytes after. Buckets come out in the order they complete (sorted by the position
/// of their last parameter in `order`); parameters inside a bucket in visiting order.
BucketAssignment assign_buckets(const std::vector<ParamSpec>& params,
                                const std::vector<size_t>& order, size_t first_cap_bytes,
                                size_t cap_bytes);

/// n-1, ..., 1, 0.
std::vector<size_t> reverse_order(size_t n);

} // namespace detail
} // namespace ddp
