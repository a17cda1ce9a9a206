#pragma once

// The backends and stores of c10d, behind types of ours: the only file that names a c10d
// type is c10d_comm.cpp (and work.cpp, which wraps c10d's Work). The version differences
// between LibTorch 1.13 and 2.x live there.

#include "distributed/comm.h"

#include <memory>
#include <optional>
#include <string>

namespace ddp {
namespace detail {

/// The rendezvous store of a group (c10d's FileStore, TCPStore, or an in-process one).
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  /// The key's value, or nullopt while it does not exist. Never blocks.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  /// The same store with every key under `prefix` (c10d's PrefixStore).
  virtual std::shared_ptr<Store> prefixed(const std::string& prefix) = 0;
  /// Whether a record under `key` was refused for its signature (Note [Signed store
  /// records]), for the error of a wait that ends without it.
  virtual bool refused(const std::string& key) { return false; }
};

/// Opens the store that `config` names ("the TCPStore at host:port", ...): a store in
/// this process for a one-rank group without one. Failures become ddp's exceptions
/// that say what to check (port in use, master unreachable).
std::shared_ptr<Store> open_store(const CommConfig& config);
/// "the TCPStore at host:port" or "the FileStore at path", for messages.
std::string store_description(const CommConfig& config);

/// ProcessGroupGloo over `store`, bound as config's gloo_interface / gloo_address say.
std::unique_ptr<Comm> make_gloo_comm(const CommConfig& config, const std::shared_ptr<Store>& store);
/// ProcessGroupNCCL on cuda:local_rank (lesson step 4). Only in builds with NCCL.
std::unique_ptr<Comm> make_nccl_comm(const CommConfig& config, const std::shared_ptr<Store>& store);

}  // namespace detail
}  // namespace ddp
