#pragma once

// Note [Free functions take global ranks]: torch.distributed's free functions
// (dist.reduce(t, dst, group=g), dist.recv(t, src, group=g), P2POp's peer, ...) name
// ranks by their global rank, the rank in the default group, also when a group is
// given; c10d's ProcessGroup methods take ranks within the group. ddp-cpp does the same:
// ddp::reduce(t, dst, op, group) converts dst here, ProcessGroup::reduce does not.

#include <ddp/distributed/process_group.h>

#include <memory>

namespace ddp {
namespace detail {

/// `group`, or the default group when it is null (Python's group=None).
std::shared_ptr<ProcessGroup> group_or_default(const std::shared_ptr<ProcessGroup>& group);

/// Global rank `global` as a rank of `group` (unchanged for the default group, null).
/// `fn` and `what` ("ddp::reduce", "dst") name the caller in the error that a rank
/// outside the group gets.
int group_rank_for(const std::shared_ptr<ProcessGroup>& group, int global, const char* fn,
                   const char* what);

/// `group`'s rank `group_rank` as a global rank (unchanged for the default group, and
/// for -1).
int global_rank_for(const std::shared_ptr<ProcessGroup>& group, int group_rank);

}  // namespace detail
}  // namespace ddp
