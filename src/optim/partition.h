#pragma once

// Which rank steps which parameter, and the check that every rank agrees.

#include <ddp/distributed/process_group.h>

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {
namespace detail {

/// Note [ZeRO partition]
/// PyTorch's ZeroRedundancyOptimizer._partition_parameters: param group by param group,
/// the group's parameters sorted by numel, largest first (stable, so equal sizes keep
/// their order), each go to the rank with the fewest elements so far (the lowest such
/// rank on a tie). The totals carry over from one group to the next. Returns the owner
/// of each parameter, the groups' parameters flattened in order. Any two ranks' totals
/// differ by at most the largest parameter's numel.
std::vector<int> partition_parameters(const std::vector<std::vector<int64_t>>& numels,
                                      int world_size);

/// One line per parameter, "group 0 parameter 3: float [16, 8]", for the check below.
std::vector<std::string> describe_parameters(
    const std::vector<torch::optim::OptimizerParamGroup>& groups);

/// Collective: throws MismatchError on every rank unless every rank's description is
/// rank 0's, naming the first rank and parameter that differ. `what` names the caller.
void check_same_everywhere(ProcessGroup& group, const std::vector<std::string>& description,
                           const std::string& what);

}  // namespace detail
}  // namespace ddp
