// Starting one attempt: a pipe pair, log files and the environment per worker.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "options.h"
#include "supervisor.h"
#include "sysinfo.h"
#include "worker_env.h"

namespace ddprun {

namespace {
constexpr size_t kKeptStderrLines = 10;
}  // namespace

void Supervisor::start_attempt(int attempt) {
  attempt_ = attempt;
  failed_index_ = -1;
  failure_.reset();
  killed_ = false;
  drain_until_ = 0;
  workers_.clear();
  AttemptInfo info{attempt, run_id_, "", omp_threads_, ""};
  info.restarts = restarts_;
  group_rank_ = o_.node_rank;
  for (size_t i = 0; i < members_.size(); ++i)
    if (members_[i] == o_.node_rank) {
      group_rank_ = info.group_rank = static_cast<int>(i);
      info.group_world_size = static_cast<int>(members_.size());
    }
  if (!o_.multi_host()) {
    std::string error;
    rendezvous_dir_ = info.rendezvous_dir = make_rendezvous_dir(run_id_, attempt, error);
    if (rendezvous_dir_.empty()) {
      std::cerr << "ddprun: error: " << error << ". Set TMPDIR to a writable folder.\n";
      coord_.local_abort(kExitError, error);
      return;
    }
  }
  // Note [Flight recorder] (src/distributed/debug/flight_recorder.h): workers write their last
  // collectives here when one fails, and at exit. The user's folder is passed on as it is;
  // one ddprun makes is kept only if the attempt fails (finish_attempt).
  flight_dir_made_ = user_flight_dir_.empty();
  if (flight_dir_made_) {
    std::string error;
    flight_dir_ = info.flight_recorder_dir =
        make_rendezvous_dir("flight-" + run_id_, attempt, error);
  } else {
    flight_dir_ = user_flight_dir_;  // the workers inherit DDP_FLIGHT_RECORDER_DIR
  }
  std::string log_dir;
  if (o_.redirect | o_.tee) {
    log_dir = log_root() + "/" + std::to_string(attempt);
  }
  state_ = State::Running;
  for (int lr = 0; lr < o_.nproc_per_node; ++lr)
    if (!spawn_one(lr, log_dir, worker_environment(o_, lr, info))) break;
}

bool Supervisor::spawn_one(int local_rank, const std::string& log_dir,
                           const std::vector<std::string>& env) {
  Worker w;
  w.local_rank = local_rank;
  w.rank = group_rank_ * o_.nproc_per_node + local_rank;
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return false;
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return false;
  }
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  std::string error;
  w.pid = spawn_worker(o_.program_path, o_.command, env, out[1], err[1], error);
  close(out[1]);
  close(err[1]);

  const std::string dir = log_dir.empty() ? "" : log_dir + "/rank" + std::to_string(w.rank);
  if (!dir.empty() && !make_dirs(dir))
    std::cerr << "ddprun: warning: cannot create " << dir << ": " << std::strerror(errno) << "\n";
  const std::string prefix = o_.no_prefix ? "" : "[rank " + std::to_string(w.rank) + "]: ";
  const int logged = o_.redirect | o_.tee;
  // --local-ranks-filter hides a rank from the console only; its log files and the
  // failure summary still get its lines.
  const int console = o_.shows_local_rank(local_rank) ? o_.redirect : 3;
  out_.push_back(std::make_unique<LineStream>(out[0], prefix, (console & 1) ? -1 : STDOUT_FILENO,
                                              (logged & 1) ? open_log(dir, "stdout.log") : -1, 0));
  err_.push_back(std::make_unique<LineStream>(err[0], prefix, (console & 2) ? -1 : STDERR_FILENO,
                                              (logged & 2) ? open_log(dir, "stderr.log") : -1,
                                              kKeptStderrLines));
  if (w.pid < 0) {
    std::cerr << "ddprun: error: cannot start rank " << w.rank << ": " << error << "\n";
    w.reaped = true;
    w.wait_status = kExitNotFound << 8;
    failed_index_ = static_cast<int>(workers_.size());
  }
  workers_.push_back(w);
  return w.pid > 0;
}

int Supervisor::open_log(const std::string& dir, const char* name) {
  if (dir.empty()) return -1;
  const std::string path = dir + "/" + name;
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    std::cerr << "ddprun: warning: cannot write " << path << ": " << std::strerror(errno) << "\n";
  return fd;
}

std::string Supervisor::log_root() {
  if (!log_root_.empty()) return log_root_;
  if (!o_.log_dir.empty()) return log_root_ = o_.log_dir;
  std::string error;
  log_root_ = make_rendezvous_dir("logs-" + run_id_, 0, error);
  if (log_root_.empty())
    std::cerr << "ddprun: warning: no log folder: " << error << "\n";
  else
    std::cerr << "ddprun: no --log-dir given; writing worker logs under " << log_root_ << "\n";
  return log_root_;
}

}  // namespace ddprun
