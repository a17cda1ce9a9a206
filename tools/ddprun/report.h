// What ddprun tells the user when a worker fails.
#pragma once

#include <sys/types.h>

#include <deque>
#include <string>
#include <vector>

#include "options.h"

namespace ddprun {

struct FailureInfo {
  int rank = -1;
  int local_rank = -1;
  pid_t pid = -1;
  int wait_status = 0;
  std::string time;  // wall clock when ddprun saw it
  std::deque<std::string> last_stderr;
  std::string log_file;             // where the full stderr went, if anywhere
  std::string flight_recorder_dir;  // the workers' flight recorder files, if any
  std::vector<std::string> flight_recorder_files;
};

std::string wall_clock_now();

// One line: "rank 1 (pid 4242 on host) failed with exit code 3".
std::string describe_failure(const FailureInfo& f, const std::string& host);

// The block printed to stderr when the job fails for good because of `f`.
std::string failure_summary(const Options& o, const FailureInfo& f, const std::string& run_id,
                            int attempt, int exit_code, int others_stopped, bool others_killed);

}  // namespace ddprun
