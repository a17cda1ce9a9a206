#include "worker_env.h"

#include <stdlib.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>

#include "sysinfo.h"

extern char** environ;

namespace ddprun {

std::vector<std::string> worker_environment(const Options& o, int local_rank,
                                            const AttemptInfo& a) {
  const int group = a.group_rank >= 0 ? a.group_rank : o.node_rank;
  const int groups = a.group_rank >= 0 ? a.group_world_size : o.nnodes;
  const int rank = group * o.nproc_per_node + local_rank;
  const int world = groups * o.nproc_per_node;
  std::map<std::string, std::string> set = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(group)},
      {"GROUP_WORLD_SIZE", std::to_string(groups)},
      {"ROLE_NAME", o.role},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(a.restarts)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", a.run_id},
      {"DDP_RUN_ID", a.run_id},
  };
  if (!a.rendezvous_dir.empty()) set["DDP_RENDEZVOUS_DIR"] = a.rendezvous_dir;
  if (!a.omp_threads.empty()) set["OMP_NUM_THREADS"] = a.omp_threads;
  if (!a.flight_recorder_dir.empty()) set["DDP_FLIGHT_RECORDER_DIR"] = a.flight_recorder_dir;
  // Note [Signed store records] (src/distributed/rendezvous/signed_records.cpp): the
  // workers sign what they put in the TCPStore with a key derived from the job secret.
  // They get the file's name, never the secret itself in the environment.
  if (!o.secret.empty()) set["DDP_SECRET_FILE"] = o.secret_file;

  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    std::string name = eq ? std::string(*e, static_cast<size_t>(eq - *e)) : *e;
    // A DDP_RENDEZVOUS_DIR inherited from an outer job must not leak into a
    // multi-host job, where the workers meet over TCP instead.
    if (set.count(name) || name == "DDP_RENDEZVOUS_DIR") continue;
    env.emplace_back(*e);
  }
  for (const auto& [name, value] : set) env.push_back(name + "=" + value);
  return env;
}

std::string default_omp_threads(int local_workers) {
  if (std::getenv("OMP_NUM_THREADS")) return "";
  int threads = affinity_cpu_count() / (local_workers > 0 ? local_workers : 1);
  return std::to_string(threads > 1 ? threads : 1);
}

std::string user_flight_recorder_dir() {
  const char* dir = std::getenv("DDP_FLIGHT_RECORDER_DIR");
  return dir ? dir : "";
}

std::string make_rendezvous_dir(const std::string& run_id, int attempt, std::string& error) {
  const char* tmp = std::getenv("TMPDIR");
  std::string safe_id = run_id.substr(0, 40);
  for (char& c : safe_id)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/ddprun-" + safe_id + "-" +
                     std::to_string(attempt) + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) {  // mkdtemp creates it with mode 0700
    error = "cannot create a rendezvous folder from '" + tmpl + "': " + std::strerror(errno);
    return "";
  }
  return buf.data();
}

}  // namespace ddprun
