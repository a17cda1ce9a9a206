#include "report.h"

#include <time.h>

#include <sstream>

#include "sysinfo.h"
#include "worker.h"

namespace ddprun {

std::string wall_clock_now() {
  time_t t = time(nullptr);
  tm local{};
  localtime_r(&t, &local);
  char buf[64];
  strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S %Z", &local);
  return buf;
}

std::string describe_failure(const FailureInfo& f, const std::string& host) {
  return "rank " + std::to_string(f.rank) + " (pid " + std::to_string(f.pid) + " on " + host +
         ") failed with " + describe_status(f.wait_status);
}

std::string failure_summary(const Options& o, const FailureInfo& f, const std::string& run_id,
                            int attempt, int exit_code, int others_stopped, bool others_killed) {
  const std::string rule(64, '=');
  const std::string thin(64, '-');
  std::ostringstream s;
  std::string command;
  for (const auto& a : o.command) {
    bool plain = !a.empty() && a.find_first_of(" \t\n'\"$;&|<>*?()[]{}\\`!#~") == std::string::npos;
    command += (command.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  if (command.size() > 200) command = command.substr(0, 197) + "...";
  s << rule << "\n"
    << "ddprun: " << command << " FAILED\n"
    << thin << "\n"
    << "first failure:\n"
    << "  rank       : " << f.rank << " (local_rank " << f.local_rank << ", node_rank "
    << o.node_rank << ")\n"
    << "  cause      : " << describe_status(f.wait_status) << "\n"
    << "  pid        : " << f.pid << "\n"
    << "  host       : " << host_name() << "\n"
    << "  time       : " << f.time << "\n"
    << "  run id     : " << run_id << "\n"
    << "  restarts   : " << attempt << " of --max-restarts " << o.max_restarts << " used\n";
  if (f.last_stderr.empty()) {
    s << "  stderr     : (nothing)\n";
  } else {
    s << "last " << f.last_stderr.size() << " stderr line(s) of rank " << f.rank << ":\n";
    for (const auto& line : f.last_stderr) s << "  " << line << "\n";
  }
  if (!f.log_file.empty()) s << "  full stderr: " << f.log_file << "\n";
  if (!f.flight_recorder_files.empty()) {
    s << "flight recorder (the last collectives of each rank that wrote one):\n";
    for (const auto& file : f.flight_recorder_files) s << "  " << file << "\n";
    s << "  line them up: python3 tools/flight_recorder.py " << f.flight_recorder_dir << "\n";
  }
  s << thin << "\n";
  if (others_stopped > 0)
    s << "stopped the other " << others_stopped << " worker(s) with SIGTERM"
      << (others_killed
              ? ", then SIGKILL after the " + seconds_text(o.grace_period) + " grace period"
              : "")
      << "\n";
  s << "ddprun exits with code " << exit_code << "\n" << rule << "\n";
  return s.str();
}

}  // namespace ddprun
