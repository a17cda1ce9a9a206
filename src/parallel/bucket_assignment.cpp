#include "parallel/bucket_assignment.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

namespace ddp {
namespace detail {

std::vector<size_t> reverse_order(size_t n) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
  return order;
}

BucketAssignment assign_buckets(const std::vector<ParamSpec>& params,
                                const std::vector<size_t>& order, size_t first_cap_bytes,
                                size_t cap_bytes) {
  TORCH_INTERNAL_ASSERT(order.size() == params.size(), "bucket order has ", order.size(),
                        " entries for ", params.size(), " parameters");
  std::vector<bool> seen(params.size(), false);
  for (size_t i : order) {
    TORCH_INTERNAL_ASSERT(i < params.size() && !seen[i], "bucket order is not a permutation");
    seen[i] = true;
  }

  struct Open {
    std::vector<size_t> members;
    size_t bytes = 0;
    bool closed_one = false;  // a bucket of this dtype and device was closed already
  };
  // Keyed by (dtype, device); a std::map keeps the leftover buckets in a fixed order.
  using Key = std::pair<int, std::pair<int, int>>;
  std::map<Key, Open> open;
  std::vector<std::pair<size_t, std::vector<size_t>>> closed;  // (last position, members)

  std::vector<size_t> position(params.size());
  for (size_t pos = 0; pos < order.size(); ++pos) position[order[pos]] = pos;

  for (size_t pos = 0; pos < order.size(); ++pos) {
    const size_t i = order[pos];
    const ParamSpec& p = params[i];
    const Key key{static_cast<int>(p.dtype),
                  {static_cast<int>(p.device.type()), static_cast<int>(p.device.index())}};
    Open& bucket = open[key];
    bucket.members.push_back(i);
    bucket.bytes += static_cast<size_t>(p.numel) * c10::elementSize(p.dtype);
    const size_t cap = bucket.closed_one ? cap_bytes : first_cap_bytes;
    if (bucket.bytes >= cap) {
      closed.emplace_back(pos, std::move(bucket.members));
      bucket = Open();
      bucket.closed_one = true;
    }
  }
  for (auto& kv : open) {
    if (kv.second.members.empty()) continue;
    const size_t last = position[kv.second.members.back()];
    closed.emplace_back(last, std::move(kv.second.members));
  }
  std::stable_sort(closed.begin(), closed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });

  BucketAssignment out;
  out.reserve(closed.size());
  for (auto& c : closed) out.push_back(std::move(c.second));
  return out;
}

BucketAssignment initial_buckets(const std::vector<ParamSpec>& params, bool one_bucket,
                                 size_t first_cap_bytes, size_t cap_bytes) {
  std::vector<size_t> order(params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const size_t unlimited = std::numeric_limits<size_t>::max();
  BucketAssignment out = assign_buckets(params, order, one_bucket ? unlimited : first_cap_bytes,
                                        one_bucket ? unlimited : cap_bytes);
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace detail
}  // namespace ddp
