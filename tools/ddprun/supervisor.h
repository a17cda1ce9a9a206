// The monitor loop: starts this host's workers, watches them, and stops,
// restarts or exits as the coordinator decides. Single-threaded: signals,
// worker pipes and the other hosts all arrive through one poll().
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coordinator.h"
#include "options.h"
#include "output.h"
#include "report.h"
#include "worker.h"

namespace ddprun {

class Supervisor {
 public:
  Supervisor(const Options& o, Coordinator& coordinator, std::string omp_threads);
  ~Supervisor();
  // Runs until the job ends; returns ddprun's exit code.
  int run();

 private:
  enum class State { Idle, Running, Stopping };

  void apply(const Decision& d);
  void start_attempt(int attempt);
  bool spawn_one(int local_rank, const std::string& log_dir, const std::vector<std::string>& env);
  void begin_stop(int sig);
  void on_signal(int sig);
  void reap();
  void check_running();
  void check_stopping(double now);
  void finish_attempt();
  int finish();
  int open_log(const std::string& dir, const char* name);
  std::string log_root();

  const Options& o_;
  Coordinator& coord_;
  const std::string omp_threads_;
  const std::string host_;
  const std::string user_flight_dir_;  // DDP_FLIGHT_RECORDER_DIR (empty: ddprun makes one)

  State state_ = State::Idle;
  int attempt_ = -1;
  int restarts_ = 0;  // TORCHELASTIC_RESTART_COUNT of the attempt started last
  std::string run_id_;
  std::vector<int> members_;  // MIN:MAX: the attempt's nodes by group rank (empty: fixed)
  int group_rank_ = 0;        // this host's, in the attempt started last
  std::string rendezvous_dir_;
  std::string flight_dir_;        // where this attempt's workers write their flight records
  bool flight_dir_made_ = false;  // by ddprun, for this attempt: removed when the attempt
                                  // ends, unless a failure left files in it
  std::string log_root_;
  std::vector<Worker> workers_;
  std::vector<std::unique_ptr<LineStream>> out_, err_;

  double kill_at_ = 0;      // SIGKILL the groups then, if still there
  double drain_until_ = 0;  // stop waiting for pipes held by stray processes
  double last_sweep_ = 0;
  bool killed_ = false;

  int failed_index_ = -1;  // first worker of this attempt that failed
  std::optional<FailureInfo> failure_;
  int others_stopped_ = 0;

  int signals_seen_ = 0;
  int stop_signal_ = 0;
  int restart_to_ = -1;  // attempt to run once the workers are gone
  bool exiting_ = false;
  Decision exit_;
};

}  // namespace ddprun
