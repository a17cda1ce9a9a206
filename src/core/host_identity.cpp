#include "core/host_identity.h"

#include <fstream>
#include <sstream>

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
  return id;
}

std::string encode(const HostIdentity& id) {
  std::ostringstream os;
  os << "host-v1 " << field(id.hostname) << ' ' << field(id.boot_id) << ' ' << id.shm_device << ' '
     << id.shm_inode << ' ' << id.pid_namespace << ' ' << id.pid;
  return os.str();
}

bool decode(const std::string& text, HostIdentity& out) {
  std::istringstream in(text);
  std::string tag, host, boot;
  HostIdentity id;
  if (!(in >> tag >> host >> boot >> id.shm_device >> id.shm_inode >> id.pid_namespace >> id.pid) ||
      tag != "host-v1") {
    return false;
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

}  // namespace detail
}  // namespace ddp
