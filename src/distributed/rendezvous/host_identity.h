#pragma once

// Note [Same host]
// Which ranks of a group share a host is decided from what they tell each other at the
// rendezvous, never from LOCAL_WORLD_SIZE (a launcher's guess, absent under plain
// init_method file:// or tcp://). Each rank publishes its identity with its arrival
// (backend_select.cpp, wait_for_arrivals); two ranks can share memory when they see the
// same kernel boot (boot id), the same host name, and the same /dev/shm (device and
// inode, so that containers with private /dev/shm mounts are told apart). This one rule
// decides the shm backend, the hierarchy and the local placement. The only thing
// decided before the ranks meet, the kind of store, cannot wait for it: there the
// launcher's word stands in (Note [One host opens no port] in rendezvous.cpp).
//
// Note [Interface from peers]
// The identity also carries the network namespace and every IPv4 address of the rank's
// up, non-loopback interfaces (address/prefix and interface name). A group whose store
// is a shared file (init_method file://) has no master address to route to, so Gloo's
// interface is chosen from these: ranks that all share one network namespace of one
// boot use 127.0.0.1; otherwise each rank binds the interface whose subnet holds an
// address of every rank outside its own namespace (choose_gloo_interface). The same
// grouping gives local_rank and local_world_size when no launcher set them.

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {
namespace detail {

struct HostIdentity {
  std::string hostname;
  std::string boot_id;         // /proc/sys/kernel/random/boot_id
  uint64_t shm_device = 0;     // stat("/dev/shm").st_dev; 0 when there is none
  uint64_t shm_inode = 0;      // stat("/dev/shm").st_ino
  uint64_t pid_namespace = 0;  // stat("/proc/self/ns/pid").st_ino; 0 when unknown
  int64_t pid = 0;
  uint64_t net_namespace = 0;  // stat("/proc/self/ns/net").st_ino; 0 when unknown

  struct Address {
    uint32_t ipv4 = 0;  // host byte order
    int prefix = 0;     // netmask length, 0..32
    std::string interface;
  };
  std::vector<Address> addresses;  // up, non-loopback IPv4 interfaces
};

/// This process's identity.
HostIdentity local_host_identity();

/// One line of text, "host-v2 ..." (what a rank publishes at the rendezvous).
std::string encode(const HostIdentity& id);
/// The identity in `text` ("host-v2", or "host-v1" without namespace and addresses);
/// false when `text` is not one (a peer of an older version publishes "1").
bool decode(const std::string& text, HostIdentity& out);

/// Whether two processes can map the same POSIX shared memory segments.
bool same_shm_host(const HostIdentity& a, const HostIdentity& b);
/// Whether a's pid can be checked from b (kill(pid, 0)): same host and pid namespace.
bool same_pid_namespace(const HostIdentity& a, const HostIdentity& b);

/// Whether every identity shares memory with the first (false for an empty list).
bool all_on_one_shm_host(const std::vector<HostIdentity>& ids);

/// Whether a and b run on one boot of one host in one network namespace, so that
/// 127.0.0.1 reaches one from the other. Unknown namespaces never match.
bool same_network_host(const HostIdentity& a, const HostIdentity& b);

/// Gloo's interface for rank `rank` of the group `ids` (Note [Interface from peers]):
/// "" when every rank shares its network host (bind 127.0.0.1), else the name of the
/// first interface of ids[rank] whose subnet holds an address of every rank on another
/// network host. When there is none, returns "" and sets *error to a message that says
/// which rank could not be reached from which addresses.
std::string choose_gloo_interface(const std::vector<HostIdentity>& ids, int rank,
                                  std::string* error);

/// This rank's position among the ranks of its network host, and how many there are.
struct LocalPlacement {
  int local_rank = 0;
  int local_world_size = 1;
};
LocalPlacement local_placement(const std::vector<HostIdentity>& ids, int rank);

/// Where a rank sits in a group by host (ranks share a host when they share memory,
/// Note [Same host]), for Note [Hierarchical all-reduce] in hier_comm.h. Hosts are
/// numbered by their lowest rank.
struct HostLayout {
  int host = 0;        // this rank's host
  int hosts = 1;       // hosts in the group
  int local_rank = 0;  // position among its host's ranks, in rank order
  int local_size = 1;  // ranks on its host
  int largest_host = 1;
  std::vector<int> host_ranks;  // the group ranks on this rank's host, in order
  bool leader() const { return local_rank == 0; }
};
HostLayout host_layout(const std::vector<HostIdentity>& ids, int rank);

/// Whether the hierarchy pays: several hosts, and more than one rank on some host.
inline bool wants_hierarchy(const HostLayout& l) { return l.hosts > 1 && l.largest_host > 1; }

/// "10.1.2.3/24" for an address.
std::string format_ipv4(uint32_t ipv4, int prefix);

}  // namespace detail
}  // namespace ddp
