#pragma once

// Groups within a group, as torch.distributed's new_group: made from the parent's
// rendezvous store (a prefix per group), with no new port and no rendezvous for the user.
//
// Example (4 ranks: two pairs, each reducing alone):
//   auto [mine, all] = ddp::new_subgroups(2);
//   ddp::all_reduce(t, ddp::ReduceOp::SUM);              // all 4 ranks
//   mine->all_reduce(t, ddp::ReduceOp::SUM);             // ranks {0, 1} or {2, 3}
//
// Every rank of the parent calls each of these, in the same order, as in PyTorch: each
// call numbers a new group on every rank. Members get a working group; the other ranks
// get a handle whose collectives refuse, saying so (is_member() is false).

#include <ddp/distributed/process_group.h>

#include <torch/arg.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

/// How a group made by new_group runs.
struct GroupOptions {
  /// "": as its parent, except that a group whose members all share one host gets
  /// "shm" when the parent is on CPUs ("shm", "hier", or an empty backend). Else
  /// "gloo", "shm" or "nccl" (the parent's device).
  TORCH_ARG(std::string, backend) = "";
  /// The limit for each collective; zero takes the parent's.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
};

/// torch.distributed.new_group: a group of `ranks` (global ranks: ranks of the default
/// group, or of `parent` when it is the one that init_process_group or
/// ProcessGroup::create made), in the order given. `parent` (the default group when
/// null) must hold every one of them. Collective over the parent: every rank calls it.
std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                        const GroupOptions& options = GroupOptions(),
                                        const std::shared_ptr<ProcessGroup>& parent = nullptr);

/// torch.distributed.new_subgroups: the parent's ranks cut into groups of `group_size`
/// consecutive ranks (which must divide its size). Returns this rank's group and all of
/// them, in order.
std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>> new_subgroups(
    int group_size, const GroupOptions& options = GroupOptions(),
    const std::shared_ptr<ProcessGroup>& parent = nullptr);

/// torch.distributed.new_subgroups_by_enumeration: one group per list of ranks; no rank
/// in two lists. Returns this rank's group (null if it is in none) and all of them.
std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>
new_subgroups_by_enumeration(const std::vector<std::vector<int>>& ranks_per_subgroup,
                             const GroupOptions& options = GroupOptions(),
                             const std::shared_ptr<ProcessGroup>& parent = nullptr);

/// torch.distributed.get_group_rank: the rank within `group` of global rank
/// `global_rank`; throws if it is not a member.
int get_group_rank(const std::shared_ptr<ProcessGroup>& group, int global_rank);
/// torch.distributed.get_global_rank: the global rank of `group`'s rank `group_rank`.
int get_global_rank(const std::shared_ptr<ProcessGroup>& group, int group_rank);
/// torch.distributed.get_process_group_ranks: `group`'s members' global ranks, in group
/// rank order.
std::vector<int> get_process_group_ranks(const std::shared_ptr<ProcessGroup>& group);

}  // namespace ddp
