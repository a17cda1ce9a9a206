// Where the ranks meet, and which address Gloo binds to.
//
// Note [One host opens no port]
// c10d's TCPStore listens on every interface whatever MASTER_ADDR says. When all ranks
// share one host, a FileStore does the same job with no socket at all. It lives in a
// private directory (mode 0700, owned by us), so other users can neither read the
// rendezvous nor inject into it:
//   - under ddprun, DDP_RENDEZVOUS_DIR is a fresh mkdtemp directory per attempt;
//   - otherwise ${TMPDIR:-/tmp}/ddp-<uid>/<addr>-<port>/, where rank 0 creates a
//     fresh store file and publishes its name in `current` (write, then rename). Other
//     ranks take the name only once its writer's pid is alive, so a file left by a
//     crashed earlier run on the same port is never joined.
// Gloo's own pair connections then bind to 127.0.0.1. Multi-host runs use TCPStore
// (see docs/process_groups.md, "Security of the rendezvous") and bind Gloo to the interface that reaches
// MASTER_ADDR (or GLOO_SOCKET_IFNAME). init_method file:// names a file that may sit on
// a shared filesystem, so its interface is chosen from what the ranks exchange
// (Note [Interface from peers]).

#include "distributed/common/check.h"
#include "distributed/backend_select.h"
#include "distributed/comm.h"
#include "distributed/rendezvous/rendezvous.h"
#include "distributed/rendezvous/signed_records.h"
#include "distributed/store_wait.h"

#include <ddp/errors.h>

#include <c10/util/Exception.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

namespace ddp {
namespace detail {
namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// Creates dir (mode 0700) if needed and checks that only we can use it.
void ensure_private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    DDP_CHECK(false, "could not create the rendezvous directory ", dir, ": ", std::strerror(errno),
              ". Set TMPDIR to a writable directory.");
  }
  struct stat st {};
  DDP_CHECK(::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "rendezvous path ", dir,
            " is not a directory. Remove it, or set TMPDIR elsewhere.");
  DDP_CHECK(st.st_uid == ::getuid() && (st.st_mode & 077) == 0, "rendezvous directory ", dir,
            " must be private (owned by uid ", ::getuid(), ", mode 0700), but it is owned by uid ",
            st.st_uid, " with mode ", (st.st_mode & 0777),
            ". Another user may be able to join this group; remove "
            "the directory or set TMPDIR elsewhere.");
}

bool pid_alive(long pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

std::string shared_store_path(const std::string& dir, int rank, std::chrono::milliseconds timeout) {
  const std::string pointer = dir + "/current";
  if (rank == 0) {
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    const std::string name =
        dir + "/store." + std::to_string(::getpid()) + "." + std::to_string(now);
    const std::string tmp = pointer + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << ::getpid() << ' ' << name << '\n';
      DDP_CHECK(out.good(), "could not write ", tmp, ": ", std::strerror(errno));
    }
    DDP_CHECK(::rename(tmp.c_str(), pointer.c_str()) == 0, "could not publish ", pointer, ": ",
              std::strerror(errno));
    return name;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(pointer);
    long pid = 0;
    std::string name;
    if (in >> pid >> name && pid_alive(pid)) return name;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw TimeoutError("rank " + std::to_string(rank) + " waited " + std::to_string(timeout.count()) +
                     " ms for rank 0 to publish " + pointer +
                     ", and it did not. Start rank 0 with the same MASTER_ADDR "
                     "and MASTER_PORT, or raise the timeout.");
}

// The interface whose network contains `addr` (an IPv4 literal), or whose address it is.
std::string interface_for(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return "";
  const uint32_t target = ntohl(reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr.s_addr);
  ::freeaddrinfo(res);
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return "";
  std::string found;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_netmask == nullptr || i->ifa_addr->sa_family != AF_INET ||
        (i->ifa_flags & IFF_UP) == 0) {
      continue;
    }
    const uint32_t a = ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
    const uint32_t m = ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr);
    if ((a & m) == (target & m)) {
      found = i->ifa_name;
      break;
    }
  }
  ::freeifaddrs(ifs);
  return found;
}

std::string tmp_root() {
  auto tmp = env_string("TMPDIR");
  return tmp ? *tmp : "/tmp";
}

void parse_host_port(const std::string& spec, const std::string& what, std::string& host,
                     int& port) {
  const auto colon = spec.rfind(':');
  DDP_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < spec.size(), what,
            " must look like host:port, but got '", spec, "'.");
  host = spec.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string p = spec.substr(colon + 1);
  char* end = nullptr;
  const long v = std::strtol(p.c_str(), &end, 10);
  DDP_CHECK(*end == '\0' && v > 0 && v < 65536, "the port in ", what,
            " must be a number in 1..65535, but got '", p, "'.");
  port = static_cast<int>(v);
}

// Debug mode and flight recorder (Note [Collective fingerprints], Note [Flight recorder]).
void resolve_diagnostics(const InitOptions& o, CommConfig& c) {
  std::string debug = o.debug();
  if (debug.empty()) debug = env_string("DDP_DEBUG").value_or("");
  debug = ascii_lower(debug);
  if (debug.empty()) {
    // PyTorch's variable, for jobs that already set it: DETAIL checks every collective.
    const std::string torch_level =
        ascii_lower(env_string("TORCH_DISTRIBUTED_DEBUG").value_or("off"));
    debug = torch_level == "detail" ? "detail" : "off";
  }
  DDP_CHECK(debug == "off" || debug == "detail",
            "debug mode must be \"off\" or "
            "\"detail\" (InitOptions::debug or DDP_DEBUG), but got \"",
            debug, "\".");
  c.debug_detail = debug == "detail";
  if (auto n = env_int("DDP_FLIGHT_RECORDER_SIZE")) c.flight_recorder_entries = *n;
  if (auto k = env_int("DDP_DEBUG_CHECK_EVERY")) {
    DDP_CHECK(*k > 0,
              "DDP_DEBUG_CHECK_EVERY must be >= 1 (iterations between DDP's "
              "parameter checksums in debug mode), but got ",
              *k, ".");
    c.debug_check_every = *k;
  }
  c.flight_recorder_dir = env_string("DDP_FLIGHT_RECORDER_DIR").value_or("");
  c.wait_report = parse_wait_report(env_string("DDP_WAIT_REPORT"));
}

// The shm backend's switches and sizes (docs/shm.md).
void resolve_shm(CommConfig& c) {
  if (auto v = env_int("DDP_SHM_SLICE_BYTES"); v && *v > 0) c.shm_slice_bytes = *v;
  if (auto v = env_int("DDP_SHM_CMA_CHUNK_BYTES"); v && *v > 0) c.shm_direct_chunk_bytes = *v;
  if (auto v = env_int("DDP_SHM_ZERO_COPY")) c.shm_zero_copy = *v != 0;
  if (auto v = env_int("DDP_SHM_CMA")) c.shm_direct = *v != 0;
}

// Note [Handed-over port]
// A launcher that picks the master's port binds and listens on it itself, and hands the
// listening socket to rank 0 (DDP_MASTER_LISTEN_FD, inherited across exec), whose store
// serves on it. The port is then never free between being chosen and being served, so
// two jobs (or two tests) started at once cannot pick the same one. LibTorch 2.x's
// TCPStore takes the socket as it is; 1.13's cannot, so there it is closed just before
// the store binds the same port again (c10d_comm.cpp). With 1.13 a client that connected
// to the handed-over socket before that is reset, so there the others must connect
// after rank 0's store listens.
int checked_listen_fd(int fd, const CommConfig& c) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  int listening = 0;
  socklen_t optlen = sizeof(listening);
  DDP_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
                ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) == 0 &&
                listening != 0,
            "DDP_MASTER_LISTEN_FD=", fd, " is not a listening socket of this process (rank ",
            c.rank, "). A launcher that sets it must bind and listen on MASTER_PORT and ",
            "leave the descriptor open across exec; otherwise unset it.");
  int port = 0;
  if (addr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  }
  DDP_CHECK(port == c.master_port, "DDP_MASTER_LISTEN_FD=", fd, " listens on port ", port,
            ", but the master port is ", c.master_port, " (", c.init_method,
            "). Hand over the socket of the master port, or unset DDP_MASTER_LISTEN_FD.");
  return fd;
}

}  // namespace

CommConfig resolve_rendezvous(const InitOptions& o) {
  CommConfig c;
  c.timeout = o.timeout();
  c.init_method = o.init_method();
  DDP_CHECK(o.timeout().count() > 0, "timeout must be > 0 ms, but got ", o.timeout().count());

  // Backend: Note [Backend choice].
  choose_backend(o.backend(), env_flag("DDP_DEVICE_STANDIN"), c);
  c.single_rank_group = o.single_rank_group() || env_flag("DDP_SINGLE_RANK_GROUP");

  // Who we are: options win over the environment.
  RankInfo env = rank_info_from_env();
  const bool from_env = env.source != "none";
  c.rank = o.rank() >= 0 ? o.rank() : env.rank;
  c.world_size = o.world_size() >= 0 ? o.world_size() : env.world_size;
  DDP_CHECK(o.rank() >= -1 && o.world_size() >= -1,
            "rank and world_size must be >= 0 "
            "(or -1 to read the environment), but got rank=",
            o.rank(), ", world_size=", o.world_size(), ".");
  DDP_CHECK(from_env || (o.rank() >= 0 && o.world_size() >= 0), "init_method ", c.init_method,
            " needs this process's rank and the world "
            "size, but neither InitOptions nor the environment (RANK/WORLD_SIZE, "
            "SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE) gives "
            "them. Launch with ddprun, or set InitOptions().rank(r).world_size(n).");
  DDP_CHECK(c.world_size >= 1, "world_size must be >= 1, but got ", c.world_size, ".");
  DDP_CHECK(c.rank < c.world_size, "rank ", c.rank, " must be < world_size ", c.world_size,
            ": ranks are numbered 0..", c.world_size - 1, ".");
  check_backend_device(c);
  // Unknown (-1) unless given: then the rendezvous below, or the ranks' hosts, decide.
  c.local_world_size = from_env && env.local_world_size > 0 ? env.local_world_size : -1;
  c.local_rank = o.local_rank() >= 0 ? o.local_rank() : from_env ? env.local_rank : -1;

  const std::string& m = c.init_method;
  if (m.rfind("file://", 0) == 0) {
    c.store = CommConfig::StoreKind::kFile;
    c.store_path = m.substr(7);
    DDP_CHECK(!c.store_path.empty() && c.store_path[0] == '/',
              "init_method file:// needs "
              "an absolute path (file:///dir/store), but got '",
              m, "'.");
    // The file may be on a shared filesystem, with ranks on several hosts: the
    // interface is chosen once they have met (Note [Interface from peers]).
    if (auto iface = env_string("GLOO_SOCKET_IFNAME")) c.gloo_interface = *iface;
  } else if (m.rfind("tcp://", 0) == 0) {
    c.store = CommConfig::StoreKind::kTcp;
    parse_host_port(m.substr(6), "init_method " + m, c.master_addr, c.master_port);
  } else if (m == "env://") {
    auto dir = env_string("DDP_RENDEZVOUS_DIR");
    auto addr = env_string("MASTER_ADDR");
    auto port = env_int("MASTER_PORT");
    // Which store: before the ranks meet, only the launcher can say that they share a
    // host (Note [One host opens no port]). Whether they really do, for everything after
    // the meeting (shared memory, placement), is decided from their host identities
    // (Note [Same host]).
    const bool launcher_says_one_host =
        dir || (c.local_world_size > 0 && c.local_world_size == c.world_size) ||
        (addr && is_loopback(*addr));
    if (c.world_size == 1) {
      c.store = CommConfig::StoreKind::kNone;
    } else if (dir) {
      ensure_private_dir(*dir);
      c.store = CommConfig::StoreKind::kFile;
      c.store_path = *dir + "/store";
      c.gloo_address = "127.0.0.1";
    } else if (launcher_says_one_host) {
      DDP_CHECK(port, "env:// needs MASTER_PORT to tell this run's ranks apart, but it is "
                      "not set. Set MASTER_PORT (any number in 1..65535, the same on every "
                      "rank), or launch with ddprun.");
      const std::string root = tmp_root() + "/ddp-" + std::to_string(::getuid());
      const std::string sub =
          root + "/" + (addr ? *addr : std::string("127.0.0.1")) + "-" + std::to_string(*port);
      ensure_private_dir(root);
      ensure_private_dir(sub);
      c.store = CommConfig::StoreKind::kFile;
      c.store_path = shared_store_path(sub, c.rank, c.timeout);
      c.gloo_address = "127.0.0.1";
    } else {
      DDP_CHECK(addr, "MASTER_ADDR is not set, but this is a multi-host run (", c.world_size,
                " ranks, LOCAL_WORLD_SIZE ",
                c.local_world_size > 0 ? std::to_string(c.local_world_size) : "unset",
                "). Set MASTER_ADDR to the address of rank 0's host on every rank (ddprun "
                "--master-addr does this); for a single-host run set LOCAL_WORLD_SIZE = "
                "WORLD_SIZE or MASTER_ADDR=127.0.0.1.");
      DDP_CHECK(port, "MASTER_PORT is not set. Set it to a free port on rank 0's host, "
                      "the same on every rank (ddprun --master-port does this).");
      c.store = CommConfig::StoreKind::kTcp;
      c.master_addr = *addr;
      c.master_port = *port;
    }
  } else {
    DDP_CHECK(false, "init_method must start with env://, tcp:// or file://, but got '", m, "'.");
  }

  if (c.store == CommConfig::StoreKind::kTcp && c.rank == 0) {
    // The socket serves one store: a group made later in the process binds the port itself.
    // It counts as taken only once it passed its checks: a group that refused it leaves
    // it to the next (otherwise that one would bind the port itself, beside the socket
    // that still holds it, and its clients would wait on a socket nobody serves).
    static std::atomic<bool> listen_fd_taken{false};
    if (auto fd = env_int("DDP_MASTER_LISTEN_FD"); fd && !listen_fd_taken.load()) {
      const int checked = checked_listen_fd(*fd, c);
      if (!listen_fd_taken.exchange(true)) c.master_listen_fd = checked;
    }
  }
  // Note [Signed store records]
  if (c.store != CommConfig::StoreKind::kNone) c.record_signer = signer_from_environment(c.rank);
  if (c.store == CommConfig::StoreKind::kTcp) {
    if (auto iface = env_string("GLOO_SOCKET_IFNAME")) {
      c.gloo_interface = *iface;
    } else if (is_loopback(c.master_addr)) {
      c.gloo_address = "127.0.0.1";
    } else {
      c.gloo_interface = interface_for(c.master_addr);
    }
  }
  // A file:// store may sit on a shared filesystem: the ranks may span hosts.
  c.interface_from_peers = c.store == CommConfig::StoreKind::kFile && m.rfind("file://", 0) == 0;
  // A local rank or local world size that neither the options nor the launcher gave is
  // counted from the hosts the ranks report at the rendezvous (Note [Same host]), so
  // that each rank of a host takes a device of its own.
  c.placement_from_peers = c.local_rank < 0 || c.local_world_size < 0;
  resolve_diagnostics(o, c);
  resolve_shm(c);
  return c;
}

}  // namespace detail
}  // namespace ddp
