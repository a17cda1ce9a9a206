#pragma once

// Note [Same host]
// Which ranks of a group share a host is decided from what they tell each other at the
// rendezvous, never from LOCAL_WORLD_SIZE (a launcher's guess, absent under plain
// init_method file:// or tcp://). Each rank publishes its identity with its arrival
// (c10d_comm.cpp, wait_for_arrivals); two ranks can share memory when they see the same
// kernel boot (boot id), the same host name, and the same /dev/shm (device and inode, so
// that containers with private /dev/shm mounts are told apart).

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
};

/// This process's identity.
HostIdentity local_host_identity();

/// One line of text, "host-v1 ..." (what a rank publishes at the rendezvous).
std::string encode(const HostIdentity& id);
/// The identity in `text`; false when `text` is not one (a peer of an older version
/// publishes "1").
bool decode(const std::string& text, HostIdentity& out);

/// Whether two processes can map the same POSIX shared memory segments.
bool same_shm_host(const HostIdentity& a, const HostIdentity& b);
/// Whether a's pid can be checked from b (kill(pid, 0)): same host and pid namespace.
bool same_pid_namespace(const HostIdentity& a, const HostIdentity& b);

/// Whether every identity shares memory with the first (false for an empty list).
bool all_on_one_shm_host(const std::vector<HostIdentity>& ids);

}  // namespace detail
}  // namespace ddp
