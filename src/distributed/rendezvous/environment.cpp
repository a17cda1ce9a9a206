// Reading who we are from launcher variables: torchrun's first, then Slurm's, then
// Open MPI's. Every malformed value is an error that names the variable.

#include "distributed/rendezvous/rendezvous.h"
#include "distributed/common/check.h"

#include <c10/util/Exception.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>

namespace ddp {
namespace detail {

std::optional<std::string> env_string(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::optional<int> env_int(const char* name) {
  auto s = env_string(name);
  if (!s) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(s->c_str(), &end, 10);
  const bool numeric = end != s->c_str() && *end == '\0' && errno == 0 &&
                       v <= std::numeric_limits<int>::max() && v >= std::numeric_limits<int>::min();
  DDP_CHECK(numeric, "environment variable ", name, " must be a non-negative integer, but got '",
            *s, "'. Fix or unset it, or launch with ddprun, which sets it.");
  DDP_CHECK(v >= 0, "environment variable ", name, " must be a non-negative integer, but got ", v,
            ". Fix or unset it, or launch with ddprun, which sets it.");
  return static_cast<int>(v);
}

bool env_flag(const char* name) {
  auto s = env_string(name);
  if (!s) return false;
  const std::string v = ascii_lower(*s);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  DDP_CHECK(false, "environment variable ", name, " must be 1 or 0 (true/false, yes/no, on/off), ",
            "but got '", *s, "'.");
  return false;
}

namespace {

struct Names {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

constexpr Names kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
};

}  // namespace

}  // namespace detail

RankInfo rank_info_from_env() {
  using namespace detail;
  RankInfo info;
  for (const Names& n : kLaunchers) {
    auto rank = env_int(n.rank);
    auto world = env_int(n.world_size);
    if (!rank && !world) continue;
    DDP_CHECK(rank && world, "found ", rank ? n.rank : n.world_size, " but not ",
              rank ? n.world_size : n.rank, " in the environment (", n.source,
              " variables): both are needed. Set the missing one, or launch with ddprun.");
    DDP_CHECK(*world >= 1, n.world_size, " must be >= 1, but got ", *world, ".");
    DDP_CHECK(*rank < *world, n.rank, "=", *rank, " must be < ", n.world_size, "=", *world,
              ": ranks are numbered 0..", *world - 1,
              ". Fix the launch command so every process gets a distinct rank below the "
              "world size.");
    info.rank = *rank;
    info.world_size = *world;
    info.source = n.source;
    auto local_world = env_int(n.local_world_size);
    auto local_rank = env_int(n.local_rank);
    info.local_world_size = local_world ? *local_world : -1;
    info.local_rank = local_rank ? *local_rank : -1;
    if (local_world) {
      DDP_CHECK(*local_world >= 1 && *local_world <= *world, n.local_world_size, "=", *local_world,
                " must be between 1 and ", n.world_size, "=", *world, ".");
    }
    if (local_rank && local_world) {
      DDP_CHECK(*local_rank < *local_world, n.local_rank, "=", *local_rank, " must be < ",
                n.local_world_size, "=", *local_world, ".");
    }
    return info;
  }
  return info;
}

}  // namespace ddp
