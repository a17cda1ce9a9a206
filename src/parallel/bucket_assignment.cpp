#include "parallel/bucket_assignment.h"

#include <c10/util/Exception.h>

#include <algorithm>
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
  };
  // Keyed by (dtype, device); a std::map keeps the leftover buckets in a fixed order.
  using Key = std::pair<int, std::pair<int, int>>;
  std::map<Key, Open> open;
  std::vector<std::pair<size_t, std::vector<size_t>>> closed;  // (last position, members)
  bool first_closed = false;

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
    const size_t cap = first_closed ? cap_bytes : first_cap_bytes;
    if (bucket.bytes >= cap) {
      closed.emplace_back(pos, std::move(bucket.members));
      open.erase(key);
      first_closed = true;
    }
  }
  for (auto& kv : open) {
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

} // namespace detail
} // namespace ddp
