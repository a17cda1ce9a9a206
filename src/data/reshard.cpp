#include "data/reshard.h"

#include "distributed/common/check.h"

#include <algorithm>

namespace ddp {
namespace detail {

// Python: ceil((n - R) / R) if drop_last and n % R != 0 else ceil(n / R). For n >= R the
// first is floor(n / R), which is also n / R when R divides n; for n < R (only after a
// re-shard: the constructor refuses it) floor gives 0, nothing left to share.
size_t share_size(size_t m, int64_t replicas, bool drop_last) {
  const size_t r = static_cast<size_t>(replicas);
  return drop_last ? m / r : (m + r - 1) / r;
}

size_t samples_per_rank(size_t dataset_size, const std::vector<DistributedSamplerStage>& stages,
                        int64_t replicas, bool drop_last) {
  // Which samples are left does not matter here, only how many: any order will do.
  const size_t left =
      stages.empty() ? dataset_size
                     : remaining_after(std::vector<size_t>(dataset_size), stages, drop_last).size();
  return share_size(left, replicas, drop_last);
}

std::vector<size_t> remaining_after(std::vector<size_t> order,
                                    const std::vector<DistributedSamplerStage>& stages,
                                    bool drop_last) {
  for (size_t i = 0; i < stages.size(); ++i) {
    const DistributedSamplerStage& stage = stages[i];
    const int64_t replicas = stage.num_replicas;
    DDP_CHECK(replicas >= 1 && stage.positions.size() == static_cast<size_t>(replicas),
              "DistributedSampler: earlier layout ", i, " of the epoch has num_replicas=", replicas,
              " but ", stage.positions.size(),
              " positions; expected one position per rank. The state is corrupt.");
    const size_t m = order.size();
    const size_t per = share_size(m, replicas, drop_last);
    for (int64_t r = 0; r < replicas; ++r) {
      const int64_t p = stage.positions[static_cast<size_t>(r)];
      DDP_CHECK(p >= 0 && static_cast<size_t>(p) <= per,
                "DistributedSampler: in earlier "
                "layout ",
                i, " of the epoch (", replicas, " ranks, ", per, " samples each), rank ", r,
                " has position ", p, "; expected 0..", per,
                ". Every rank of that layout must have saved its position.");
    }
    std::vector<size_t> rest;
    const size_t slots = std::min(m, per * static_cast<size_t>(replicas));  // no padding
    rest.reserve(slots);
    for (size_t k = 0; k < slots; ++k) {
      const size_t r = k % static_cast<size_t>(replicas);
      if (static_cast<int64_t>(k / static_cast<size_t>(replicas)) >= stage.positions[r]) {
        rest.push_back(order[k]);
      }
    }
    order = std::move(rest);
  }
  return order;
}

}  // namespace detail
}  // namespace ddp
