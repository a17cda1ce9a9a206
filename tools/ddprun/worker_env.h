// The environment each worker is given (torchrun's variables plus ddp-cpp's).
#pragma once

#include <string>
#include <vector>

#include "options.h"

namespace ddprun {

struct AttemptInfo {
  int attempt = 0;
  std::string run_id;
  std::string rendezvous_dir;       // empty on several hosts
  std::string omp_threads;          // empty: leave OMP_NUM_THREADS as it is
  std::string flight_recorder_dir;  // empty: the user's DDP_FLIGHT_RECORDER_DIR, if any
  // --nnodes MIN:MAX: this host's group rank and the number of hosts in this attempt;
  // -1 and 0 with a fixed number of hosts (the options' node rank and nnodes).
  int group_rank = -1;
  int group_world_size = 0;
  // TORCHELASTIC_RESTART_COUNT: restarts after failures (a host admitted by a restart
  // does not count, as in torchrun); `attempt` counts every start.
  int restarts = 0;
};

// ddprun's own environment with the worker's variables set (and any stale
// DDP_RENDEZVOUS_DIR dropped), as "NAME=value" strings.
std::vector<std::string> worker_environment(const Options& o, int local_rank, const AttemptInfo& a);

// OMP_NUM_THREADS for the workers when the user has not set it, else empty.
std::string default_omp_threads(int local_workers);

// The DDP_FLIGHT_RECORDER_DIR the user set, which the workers then inherit; empty when it
// is unset or empty, and then ddprun makes a folder per attempt (Note [Flight recorder]).
std::string user_flight_recorder_dir();

// A fresh private folder (mode 0700) for the workers' FileStore, or empty with
// `error` set.
std::string make_rendezvous_dir(const std::string& run_id, int attempt, std::string& error);

}  // namespace ddprun
