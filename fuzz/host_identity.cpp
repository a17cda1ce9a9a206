// Fuzz target: the host identity a rank publishes at the rendezvous and every other rank
// reads (ddp/arrived/<rank>, Note [Same host]): decode in
// src/distributed/rendezvous/host_identity.{h,cpp}, and what the group decides from the
// identities (choose_gloo_interface, local_placement, all_on_one_shm_host).
//
// The input is split at its first newline into two identities, a group of two ranks.
// What decodes must encode to one line that decodes to the same identity. The decisions
// must stay in range: a local rank below the local world size, at most the group's size.
#include "distributed/rendezvous/host_identity.h"

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.h"

namespace id = ddp::detail;

namespace {

std::string difference(const id::HostIdentity& a, const id::HostIdentity& b) {
  if (a.hostname != b.hostname) return "hostname";
  if (a.boot_id != b.boot_id) return "boot_id";
  if (a.shm_device != b.shm_device || a.shm_inode != b.shm_inode) return "/dev/shm";
  if (a.pid_namespace != b.pid_namespace || a.pid != b.pid) return "pid";
  if (a.net_namespace != b.net_namespace) return "net_namespace";
  if (a.addresses.size() != b.addresses.size()) return "number of addresses";
  for (size_t i = 0; i < a.addresses.size(); ++i) {
    const auto &x = a.addresses[i], &y = b.addresses[i];
    if (x.ipv4 != y.ipv4 || x.prefix != y.prefix || x.interface != y.interface)
      return "address " + std::to_string(i);
  }
  return "";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t newline = text.find('\n');
  const std::string parts[2] = {text.substr(0, newline),
                                newline == std::string::npos ? text : text.substr(newline + 1)};
  std::vector<id::HostIdentity> ids;
  for (const std::string& part : parts) {
    id::HostIdentity one;
    if (!id::decode(part, one)) return 0;
    const std::string line = id::encode(one);
    FUZZ_CHECK(line.find('\n') == std::string::npos, "encode wrote a newline");
    id::HostIdentity again;
    FUZZ_CHECK(id::decode(line, again),
               "decode refused what encode wrote: " + ddp_fuzz::escaped(line));
    const std::string diff = difference(one, again);
    FUZZ_CHECK(diff.empty(), "the round trip changed the " + diff + ": " + ddp_fuzz::escaped(line));
    ids.push_back(one);
  }
  for (int rank = 0; rank < 2; ++rank) {
    std::string error;
    const std::string iface = id::choose_gloo_interface(ids, rank, &error);
    FUZZ_CHECK(iface.empty() || error.empty(), "an interface and an error at once");
    const id::LocalPlacement p = id::local_placement(ids, rank);
    FUZZ_CHECK(p.local_world_size >= 1 && p.local_world_size <= 2 && p.local_rank >= 0 &&
                   p.local_rank < p.local_world_size,
               "local placement " + std::to_string(p.local_rank) + " of " +
                   std::to_string(p.local_world_size));
  }
  (void)id::all_on_one_shm_host(ids);
  return 0;
}
