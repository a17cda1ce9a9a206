// ddprun: the process launcher of ddp-cpp (torchrun's counterpart for C++).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <iostream>

#include "auth.h"
#include "control_channel.h"
#include "coordinator.h"
#include "options.h"
#include "signals.h"
#include "supervisor.h"
#include "sysinfo.h"
#include "worker_env.h"

namespace {

// Whether every address `host` names is a loopback one (a job that no other machine
// can reach).
bool only_loopback(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return false;
  bool loopback = true;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      const uint32_t a = ntohl(reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr.s_addr);
      loopback = loopback && (a >> 24) == 127;
    } else if (ai->ai_family == AF_INET6) {
      const in6_addr& a = reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr;
      loopback = loopback &&
                 (IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127));
    } else {
      loopback = false;
    }
  }
  freeaddrinfo(res);
  return loopback;
}

// `ddprun --make-secret FILE` (or --make-secret=FILE), and nothing else.
int make_secret(int argc, char** argv) {
  const std::string flag = argv[1];
  const size_t eq = flag.find('=');
  std::string path;
  if (eq != std::string::npos && argc == 2) path = flag.substr(eq + 1);
  if (eq == std::string::npos && argc == 3) path = argv[2];
  if (path.empty()) {
    std::cerr << "ddprun: error: --make-secret expects one file name and nothing else: "
                 "ddprun --make-secret FILE\n";
    return ddprun::kExitUsage;
  }
  std::string error;
  if (!ddprun::auth::make_secret_file(path, error)) {
    std::cerr << "ddprun: error: " << error << "\n";
    return ddprun::kExitError;
  }
  std::cerr << "ddprun: wrote a new job secret to " << path
            << " (mode 0600). Copy it to every host of the job out of band (e.g. scp -p), and "
               "give each --rdzv-secret-file "
            << path << ".\n";
  return 0;
}

bool is_make_secret(const char* arg) {
  for (const char* name : {"--make-secret", "--make_secret"}) {
    const size_t n = std::strlen(name);
    if (std::strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=')) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ddprun;
  if (argc >= 2 && is_make_secret(argv[1])) return make_secret(argc, argv);
  int exit_code = 0;
  std::optional<Options> parsed = parse_options(argc, argv, exit_code);
  if (!parsed) return exit_code;
  Options& o = *parsed;
  o.command_line = shell_quoted(argc, argv);

  if (!o.secret_file.empty()) {
    std::string error;
    if (!auth::load_secret_file(o.secret_file, o.secret, error)) {
      std::cerr << "ddprun: error: " << error << "\n";
      return kExitUsage;
    }
    // The workers read it too (DDP_SECRET_FILE) to sign the store's records, from
    // whatever directory they run in.
    if (char* full = ::realpath(o.secret_file.c_str(), nullptr)) {
      o.secret_file = full;
      std::free(full);
    }
  } else if (o.multi_host() && !only_loopback(o.master_addr)) {
    std::cerr << "ddprun: warning: no --rdzv-secret-file, so anyone who can reach " << o.master_addr
              << ":" << o.rdzv_port
              << " can join this job as a host or give it orders; make a secret with "
                 "'ddprun --make-secret FILE', copy it to every host and give each "
                 "--rdzv-secret-file FILE (docs/security.md)\n";
  }

  install_signal_pipe();
  // Orphaned descendants of the workers become ddprun's children, so they can
  // be reaped (no zombies) and found when the job ends.
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  if (o.run_id.empty()) o.run_id = random_hex_id(6);
  if (!o.multi_host() && o.master_port == 0) {
    o.master_port = pick_free_port();
    if (o.master_port == 0) {
      std::cerr << "ddprun: error: could not find a free port on 127.0.0.1; pass --master-port.\n";
      return kExitError;
    }
  }
  const std::string omp = default_omp_threads(o.nproc_per_node);
  if (!omp.empty())
    std::cerr << "ddprun: OMP_NUM_THREADS is not set; giving each of the " << o.nproc_per_node
              << " worker(s) OMP_NUM_THREADS=" << omp << " (" << affinity_cpu_count()
              << " cores here). Set it yourself to change this.\n";

  std::unique_ptr<Coordinator> coordinator;
  if (!o.multi_host())
    coordinator = make_local_coordinator(o.max_restarts, o.run_id);
  else if (o.dynamic_rank())
    coordinator = make_c10d_coordinator(o, o.run_id, exit_code);
  else if (o.node_rank == 0)
    coordinator = make_node0_coordinator(o, o.run_id, exit_code);
  else
    coordinator = make_agent_coordinator(o, exit_code);
  if (!coordinator) return exit_code;

  Supervisor supervisor(o, *coordinator, omp);
  return supervisor.run();
}
