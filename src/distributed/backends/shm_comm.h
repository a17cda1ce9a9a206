#pragma once

// The "shm" backend: the Comm interface over the shared-memory transport
// (shm_transport.h) for a group whose ranks all share one host (Note [Same host]).
// Collectives run in order on one worker thread per group, so that they are
// asynchronous exactly as Gloo's are: all_reduce returns a PendingWork at once and its
// future completes when the tensor holds the result. What the transport does not carry
// (other dtypes, CUDA tensors, several tensors per call) goes to a Gloo group made
// alongside, over the same store.

#include "distributed/comm.h"
#include "distributed/rendezvous/host_identity.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddp {
namespace detail {

/// What the shm backend needs from the group being made.
struct ShmSetup {
  std::function<void(const std::string& key, const std::string& value)> store_set;
  std::function<std::optional<std::string>(const std::string& key)> store_try_get;
  /// Every rank's identity, from the rendezvous.
  std::vector<HostIdentity> identities;
  /// Makes the Gloo group for what shared memory does not carry.
  std::function<std::unique_ptr<Comm>()> make_fallback;
};

/// Connects every rank of `config` through one shared-memory segment. Collective over
/// the group: every rank calls it. Returns nullptr, with the reason in *why_not, when
/// the segment cannot be made or mapped on some rank; then every rank returns nullptr
/// (with the first failure it saw), so that they can all fall back to Gloo together. Throws
/// TimeoutError when a rank does not come within the timeout.
std::unique_ptr<Comm> make_shm_comm(const CommConfig& config, const ShmSetup& setup,
                                    std::string* why_not);

/// Whether the shared-memory transport reduces tensors of this dtype.
bool shm_reduces(c10::ScalarType dtype);

/// When `comm` is a "shm" Comm, makes every wait of every rank of its transport fail at
/// once (a hierarchy whose leader failed stops the ranks of its host this way, Note
/// [Hierarchical all-reduce]). Other Comms: nothing.
void abort_shm_comm(Comm& comm);

}  // namespace detail
}  // namespace ddp
