#pragma once

// Rendezvous: how this process finds its peers. The environment variables it reads
// (environment.cpp), and the plan made from them and InitOptions (rendezvous.cpp).

#include <ddp/distributed/process_group.h>

#include <optional>
#include <string>

namespace ddp {
namespace detail {

/// The variable's value; nullopt when unset or empty.
std::optional<std::string> env_string(const char* name);
/// The variable as a non-negative int; nullopt when unset. Throws, naming the variable,
/// when it is negative or not a number.
std::optional<int> env_int(const char* name);

/// Whether a switch variable is on: "1", "true", "yes" or "on" (any case). Unset, empty,
/// "0", "false", "no" and "off" are off; anything else throws, naming the variable.
bool env_flag(const char* name);

/// Turns options and environment into a complete rendezvous plan (rendezvous.cpp).
struct CommConfig;
CommConfig resolve_rendezvous(const InitOptions& options);

}  // namespace detail
}  // namespace ddp
