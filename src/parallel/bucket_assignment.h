#pragma once

// Which parameters share a bucket. Pure: no tensors, no communication, so every rank
// computes the same assignment from the same inputs.
//
// Note [Bucket order]
// Buckets are launched strictly in bucket order, the same on every rank, because
// collectives must be issued in the same order everywhere. A bucket is launched once
// all its gradients and all earlier buckets are ready, so buckets should follow the
// order in which gradients become ready. Before the first backward that order is
// unknown, and the first iteration uses PyTorch's initial buckets (initial_buckets):
// without find_unused_parameters (or with static_graph) a single bucket per dtype and
// device, in parameter order, reduced once backward has ended, so that a collective
// inside backward can never be matched against a bucket launched early on another
// rank; with find_unused_parameters, buckets of the usual caps over parameter order,
// launched in reverse (layers registered first run first in forward, so their
// gradients come last). After the first iteration the real order is known and the
// buckets are rebuilt from it (rank 0's order, broadcast, so all ranks agree), except
// with find_unused_parameters and no static_graph, as in PyTorch. The first bucket
// closed for each dtype and device is kept small (first_cap_bytes) so that
// communication starts early. Following PyTorch's layout also means Gloo sums every
// element in the same order as PyTorch, so both produce the same bits.

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
/// is closed once its bytes reach its cap: first_cap_bytes for the first bucket closed
/// for that dtype and device, cap_bytes after. Buckets come out in the order they complete (sorted by the position
/// of their last parameter in `order`); parameters inside a bucket in visiting order.
BucketAssignment assign_buckets(const std::vector<ParamSpec>& params,
                                const std::vector<size_t>& order, size_t first_cap_bytes,
                                size_t cap_bytes);

/// PyTorch's buckets before the first backward (Note [Bucket order]): parameters in
/// order 0..n-1, one bucket per dtype and device when `one_bucket`, else closed at the
/// caps; buckets sorted by their first parameter, then reversed.
BucketAssignment initial_buckets(const std::vector<ParamSpec>& params, bool one_bucket,
                                 size_t first_cap_bytes, size_t cap_bytes);

/// n-1, ..., 1, 0.
std::vector<size_t> reverse_order(size_t n);

}  // namespace detail
}  // namespace ddp
