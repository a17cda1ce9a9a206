#pragma once

// Note [Hierarchical all-reduce]
// A CPU group whose ranks span hosts, with several ranks on at least one host, reduces in
// three steps: an all-reduce among the ranks of each host over shared memory, an
// all-reduce among one leader per host (its lowest rank) over Gloo, and a broadcast from
// each leader to the ranks of its host over shared memory. Only the leaders' traffic
// crosses the network, once per host instead of once per rank, and the result is the
// same bits on every rank (the leaders' Gloo all-reduce gives every leader the same
// result, and each host copies its leader's). Everything else (broadcast, all_gather,
// barrier, other dtypes, the store) goes to a Gloo group over all ranks, made alongside.
//
// Chosen by an empty backend on a CPU (Comm::create), never by "gloo" or "shm". A group
// that cannot set up shared memory on some host falls back to Gloo on every rank: all
// ranks agree first, so that none waits in a group the others never make.

#include "distributed/comm.h"
#include "distributed/rendezvous/host_identity.h"

#include <memory>
#include <vector>

namespace ddp {
namespace detail {

/// The "hier" Comm of Note [Hierarchical all-reduce]. `local` is the shm group of this
/// rank's host (null when it is alone there), `leaders` the Gloo group of the hosts'
/// leaders (null on other ranks), `global` the Gloo group of all ranks.
std::unique_ptr<Comm> make_hier_comm(CommConfig config, HostLayout layout,
                                     std::unique_ptr<Comm> global, std::unique_ptr<Comm> local,
                                     std::unique_ptr<Comm> leaders);

}  // namespace detail
}  // namespace ddp
