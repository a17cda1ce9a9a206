// new_group and the subgroup helpers (ddp/distributed/groups.h): Note [Groups from the
// parent's store] in backend_select.cpp says how a group is made.

#include <ddp/distributed/groups.h>

#include "distributed/common/check.h"
#include "distributed/comm.h"
#include "distributed/global_ranks.h"

#include <algorithm>
#include <set>
#include <sstream>

namespace ddp {
namespace {

std::string list_of(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

}  // namespace

std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, const GroupOptions& options,
                                        const std::shared_ptr<ProcessGroup>& parent) {
  std::shared_ptr<ProcessGroup> p = parent ? parent : default_group();
  DDP_CHECK(p->is_member(),
            "new_group: this rank is not a member of the parent group (global "
            "ranks ",
            list_of(p->ranks()), "); make the new group from a group it belongs to.");
  detail::Comm& pc = detail::comm_of(*p);
  // Numbered before any check that might throw on some ranks only, so that the ranks
  // that go on agree on the numbers of the groups that follow.
  const int id = pc.next_group_id();
  const int me = p->ranks()[static_cast<size_t>(p->rank())];
  DDP_CHECK(!ranks.empty(), "new_group got no ranks on rank ", me,
            "; list the global ranks of the new group.");
  std::vector<int> parent_ranks;
  std::set<int> seen;
  for (int r : ranks) {
    const auto it = std::find(p->ranks().begin(), p->ranks().end(), r);
    DDP_CHECK(it != p->ranks().end(), "new_group: rank ", r, " of ", list_of(ranks),
              " is not in the parent group (global ranks ", list_of(p->ranks()), "), on rank ", me,
              ".");
    DDP_CHECK(seen.insert(r).second, "new_group: rank ", r, " appears twice in ", list_of(ranks),
              ", on rank ", me, ".");
    parent_ranks.push_back(static_cast<int>(it - p->ranks().begin()));
  }
  const bool member = seen.count(me) > 0;
  std::unique_ptr<detail::Comm> comm;
  if (member) comm = pc.create_subgroup(parent_ranks, id, options.backend(), options.timeout());
  std::shared_ptr<ProcessGroup> g(new ProcessGroup(std::move(comm)));
  g->ranks_ = ranks;
  g->member_ = member;
  g->self_ = me;
  return g;
}

namespace {

std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>> make_all(
    const std::vector<std::vector<int>>& lists, const GroupOptions& options,
    const std::shared_ptr<ProcessGroup>& parent) {
  std::shared_ptr<ProcessGroup> p = parent ? parent : default_group();
  std::set<int> used;
  for (const auto& list : lists) {
    for (int r : list) {
      DDP_CHECK(used.insert(r).second, "new_subgroups_by_enumeration: rank ", r,
                " is in two subgroups; each rank may be in one at most.");
    }
  }
  std::shared_ptr<ProcessGroup> mine;
  std::vector<std::shared_ptr<ProcessGroup>> all;
  for (const auto& list : lists) {
    all.push_back(new_group(list, options, p));
    if (all.back()->is_member()) mine = all.back();
  }
  return {mine, all};
}

}  // namespace

std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>> new_subgroups(
    int group_size, const GroupOptions& options, const std::shared_ptr<ProcessGroup>& parent) {
  std::shared_ptr<ProcessGroup> p = parent ? parent : default_group();
  const int world = p->size();
  DDP_CHECK(group_size > 0 && world % group_size == 0, "new_subgroups: group_size ", group_size,
            " must be positive and divide the group's size, ", world, ".");
  std::vector<std::vector<int>> lists;
  for (int start = 0; start < world; start += group_size) {
    lists.emplace_back(p->ranks().begin() + start, p->ranks().begin() + start + group_size);
  }
  return make_all(lists, options, p);
}

std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>
new_subgroups_by_enumeration(const std::vector<std::vector<int>>& ranks_per_subgroup,
                             const GroupOptions& options,
                             const std::shared_ptr<ProcessGroup>& parent) {
  DDP_CHECK(!ranks_per_subgroup.empty(), "new_subgroups_by_enumeration got no subgroups.");
  return make_all(ranks_per_subgroup, options, parent);
}

int get_group_rank(const std::shared_ptr<ProcessGroup>& group, int global_rank) {
  DDP_CHECK(group, "get_group_rank got no group.");
  const auto& ranks = group->ranks();
  const auto it = std::find(ranks.begin(), ranks.end(), global_rank);
  DDP_CHECK(it != ranks.end(), "get_group_rank: global rank ", global_rank,
            " is not in the group (global ranks ", list_of(ranks), ").");
  return static_cast<int>(it - ranks.begin());
}

int get_global_rank(const std::shared_ptr<ProcessGroup>& group, int group_rank) {
  DDP_CHECK(group, "get_global_rank got no group.");
  const auto& ranks = group->ranks();
  DDP_CHECK(group_rank >= 0 && group_rank < static_cast<int>(ranks.size()),
            "get_global_rank: group rank ", group_rank, " is not in 0..", ranks.size() - 1, ".");
  return ranks[static_cast<size_t>(group_rank)];
}

namespace detail {

std::shared_ptr<ProcessGroup> group_or_default(const std::shared_ptr<ProcessGroup>& group) {
  return group ? group : default_group();
}

int group_rank_for(const std::shared_ptr<ProcessGroup>& group, int global, const char* fn,
                   const char* what) {
  if (!group) return global;  // the default group's ranks are the global ones
  const auto& ranks = group->ranks();
  const auto it = std::find(ranks.begin(), ranks.end(), global);
  DDP_CHECK(it != ranks.end(), fn, ": ", what, " ", global,
            " is not a rank of the group, whose global ranks are ", list_of(ranks),
            ". The free functions take global ranks, as torch.distributed's do; the "
            "ProcessGroup methods take ranks within the group (0..",
            static_cast<int>(ranks.size()) - 1, ").");
  return static_cast<int>(it - ranks.begin());
}

int global_rank_for(const std::shared_ptr<ProcessGroup>& group, int group_rank) {
  if (!group || group_rank < 0) return group_rank;
  return get_global_rank(group, group_rank);
}

}  // namespace detail

std::vector<int> get_process_group_ranks(const std::shared_ptr<ProcessGroup>& group) {
  DDP_CHECK(group, "get_process_group_ranks got no group.");
  return group->ranks();
}

}  // namespace ddp
