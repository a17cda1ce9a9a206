#include "distributed/rendezvous/host_identity.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ddp {
namespace detail {
namespace {

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Host names have no spaces; an empty field is written as "-".
std::string field(const std::string& s) { return s.empty() ? "-" : s; }
std::string unfield(const std::string& s) { return s == "-" ? "" : s; }

int prefix_of(uint32_t mask) {
  int n = 0;
  while (n < 32 && (mask & (0x80000000u >> n)) != 0) ++n;
  return n;
}

uint32_t mask_of(int prefix) {
  return prefix <= 0 ? 0 : prefix >= 32 ? 0xffffffffu : ~(0xffffffffu >> prefix);
}

std::vector<HostIdentity::Address> local_ipv4_addresses() {
  std::vector<HostIdentity::Address> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_netmask == nullptr || i->ifa_addr->sa_family != AF_INET ||
        (i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) {
      continue;
    }
    HostIdentity::Address a;
    a.ipv4 = ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
    a.prefix = prefix_of(ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr));
    a.interface = i->ifa_name;
    out.push_back(a);
  }
  ::freeifaddrs(ifs);
  return out;
}

bool parse_address(const std::string& text, HostIdentity::Address& a) {
  const auto slash = text.find('/');
  const auto slash2 = slash == std::string::npos ? slash : text.find('/', slash + 1);
  if (slash2 == std::string::npos) return false;
  in_addr addr{};
  if (::inet_pton(AF_INET, text.substr(0, slash).c_str(), &addr) != 1) return false;
  try {
    a.prefix = std::stoi(text.substr(slash + 1, slash2 - slash - 1));
  } catch (const std::exception&) {
    return false;
  }
  if (a.prefix < 0 || a.prefix > 32) return false;
  a.ipv4 = ntohl(addr.s_addr);
  a.interface = text.substr(slash2 + 1);
  return !a.interface.empty();
}

}  // namespace

HostIdentity local_host_identity() {
  HostIdentity id;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) == 0) id.hostname = name;
  id.boot_id = first_line("/proc/sys/kernel/random/boot_id");
  struct stat st {};
  if (::stat("/dev/shm", &st) == 0) {
    id.shm_device = static_cast<uint64_t>(st.st_dev);
    id.shm_inode = static_cast<uint64_t>(st.st_ino);
  }
  if (::stat("/proc/self/ns/pid", &st) == 0) id.pid_namespace = static_cast<uint64_t>(st.st_ino);
  id.pid = static_cast<int64_t>(::getpid());
  if (::stat("/proc/self/ns/net", &st) == 0) id.net_namespace = static_cast<uint64_t>(st.st_ino);
  id.addresses = local_ipv4_addresses();
  return id;
}

std::string format_ipv4(uint32_t ipv4, int prefix) {
  char text[32];
  std::snprintf(text, sizeof(text), "%u.%u.%u.%u/%d", (ipv4 >> 24) & 255u, (ipv4 >> 16) & 255u,
                (ipv4 >> 8) & 255u, ipv4 & 255u, prefix);
  return text;
}

// Interface names hold no '/' or white space (the kernel refuses them), so an address
// is written "a.b.c.d/prefix/name".
std::string encode(const HostIdentity& id) {
  std::ostringstream os;
  os << "host-v2 " << field(id.hostname) << ' ' << field(id.boot_id) << ' ' << id.shm_device << ' '
     << id.shm_inode << ' ' << id.pid_namespace << ' ' << id.pid << ' ' << id.net_namespace << ' '
     << id.addresses.size();
  for (const auto& a : id.addresses)
    os << ' ' << format_ipv4(a.ipv4, a.prefix) << '/' << a.interface;
  return os.str();
}

bool decode(const std::string& text, HostIdentity& out) {
  std::istringstream in(text);
  std::string tag, host, boot;
  HostIdentity id;
  if (!(in >> tag >> host >> boot >> id.shm_device >> id.shm_inode >> id.pid_namespace >> id.pid) ||
      (tag != "host-v1" && tag != "host-v2")) {
    return false;
  }
  if (tag == "host-v2") {
    size_t n = 0;
    if (!(in >> id.net_namespace >> n) || n > 4096) return false;
    for (size_t i = 0; i < n; ++i) {
      std::string word;
      HostIdentity::Address a;
      if (!(in >> word) || !parse_address(word, a)) return false;
      id.addresses.push_back(a);
    }
  }
  id.hostname = unfield(host);
  id.boot_id = unfield(boot);
  out = id;
  return true;
}

bool same_shm_host(const HostIdentity& a, const HostIdentity& b) {
  return !a.boot_id.empty() && a.boot_id == b.boot_id && a.hostname == b.hostname &&
         a.shm_device != 0 && a.shm_device == b.shm_device && a.shm_inode == b.shm_inode;
}

bool same_pid_namespace(const HostIdentity& a, const HostIdentity& b) {
  return same_shm_host(a, b) && a.pid_namespace != 0 && a.pid_namespace == b.pid_namespace;
}

bool all_on_one_shm_host(const std::vector<HostIdentity>& ids) {
  if (ids.empty()) return false;
  for (const auto& id : ids) {
    if (!same_shm_host(ids.front(), id)) return false;
  }
  return true;
}

bool same_network_host(const HostIdentity& a, const HostIdentity& b) {
  return !a.boot_id.empty() && a.boot_id == b.boot_id && a.hostname == b.hostname &&
         a.net_namespace != 0 && a.net_namespace == b.net_namespace;
}

std::string choose_gloo_interface(const std::vector<HostIdentity>& ids, int rank,
                                  std::string* error) {
  const HostIdentity& me = ids.at(static_cast<size_t>(rank));
  std::vector<size_t> elsewhere;
  for (size_t r = 0; r < ids.size(); ++r) {
    if (!same_network_host(me, ids[r])) elsewhere.push_back(r);
  }
  if (elsewhere.empty()) return "";
  auto reaches = [](const HostIdentity::Address& mine, const HostIdentity& peer) {
    const uint32_t m = mask_of(mine.prefix);
    for (const auto& a : peer.addresses) {
      if ((a.ipv4 & m) == (mine.ipv4 & m)) return true;
    }
    return false;
  };
  for (const auto& mine : me.addresses) {
    bool all = true;
    for (size_t r : elsewhere) all = all && reaches(mine, ids[r]);
    if (all) return mine.interface;
  }
  if (error != nullptr) {
    auto list = [](const HostIdentity& id) {
      std::string s;
      for (const auto& a : id.addresses) {
        s += (s.empty() ? "" : ", ") + format_ipv4(a.ipv4, a.prefix) + " (" + a.interface + ")";
      }
      return s.empty() ? std::string("none") : s;
    };
    size_t unreached = elsewhere.front();
    for (size_t r : elsewhere) {
      bool any = false;
      for (const auto& mine : me.addresses) any = any || reaches(mine, ids[r]);
      if (!any) {
        unreached = r;
        break;
      }
    }
    *error = "no network interface of rank " + std::to_string(rank) + " (on '" + me.hostname +
             "': " + list(me) + ") shares a subnet with every rank on another host; rank " +
             std::to_string(unreached) + " is on '" + ids[unreached].hostname +
             "' with addresses " + list(ids[unreached]);
  }
  return "";
}

HostLayout host_layout(const std::vector<HostIdentity>& ids, int rank) {
  HostLayout l;
  const int n = static_cast<int>(ids.size());
  std::vector<int> host_of(static_cast<size_t>(n), -1);
  std::vector<int> sizes;
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < r && host_of[static_cast<size_t>(r)] < 0; ++q) {
      if (same_shm_host(ids[static_cast<size_t>(q)], ids[static_cast<size_t>(r)])) {
        host_of[static_cast<size_t>(r)] = host_of[static_cast<size_t>(q)];
      }
    }
    if (host_of[static_cast<size_t>(r)] < 0) {
      host_of[static_cast<size_t>(r)] = static_cast<int>(sizes.size());
      sizes.push_back(0);
    }
    ++sizes[static_cast<size_t>(host_of[static_cast<size_t>(r)])];
  }
  l.host = host_of.at(static_cast<size_t>(rank));
  l.hosts = static_cast<int>(sizes.size());
  l.local_size = sizes[static_cast<size_t>(l.host)];
  for (int s : sizes) l.largest_host = std::max(l.largest_host, s);
  for (int r = 0; r < n; ++r) {
    if (host_of[static_cast<size_t>(r)] != l.host) continue;
    if (r < rank) ++l.local_rank;
    l.host_ranks.push_back(r);
  }
  return l;
}

LocalPlacement local_placement(const std::vector<HostIdentity>& ids, int rank) {
  LocalPlacement p;
  p.local_world_size = 0;
  const HostIdentity& me = ids.at(static_cast<size_t>(rank));
  for (size_t r = 0; r < ids.size(); ++r) {
    if (static_cast<int>(r) != rank && !same_network_host(me, ids[r])) continue;
    if (static_cast<int>(r) < rank) ++p.local_rank;
    ++p.local_world_size;
  }
  return p;
}

}  // namespace detail
}  // namespace ddp
