#include "supervisor.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "signals.h"
#include "sysinfo.h"
#include "worker_env.h"

namespace ddprun {

namespace {
constexpr double kStrayDrainSeconds = 2.0;
}  // namespace

Supervisor::Supervisor(const Options& o, Coordinator& coordinator, std::string omp_threads)
    : o_(o),
      coord_(coordinator),
      omp_threads_(std::move(omp_threads)),
      host_(host_name()),
      user_flight_dir_(user_flight_recorder_dir()) {}

Supervisor::~Supervisor() { remove_tree(rendezvous_dir_); }

int Supervisor::run() {
  for (;;) {
    Decision d;
    while (coord_.next(d)) apply(d);
    if (state_ == State::Idle) {
      if (exiting_) return finish();
      if (restart_to_ >= 0) {
        int attempt = restart_to_;
        restart_to_ = -1;
        coord_.local_stopped(attempt);
        continue;
      }
    }

    std::vector<pollfd> fds{{signal_pipe_fd(), POLLIN, 0}};
    std::vector<LineStream*> streams;
    for (auto* list : {&out_, &err_})
      for (auto& s : *list)
        if (s->open()) {
          fds.push_back({s->fd(), POLLIN, 0});
          streams.push_back(s.get());
        }
    const size_t first_link_fd = fds.size();
    coord_.add_poll_fds(fds);

    double wait = state_ == State::Running ? o_.monitor_interval : 0.1;
    if (state_ == State::Stopping && !killed_)
      wait = std::min(wait, std::max(0.0, kill_at_ - now_seconds()));
    int rc = poll(fds.data(), fds.size(), static_cast<int>(std::min(wait, 1.0) * 1000));
    if (rc < 0 && errno != EINTR) {
      std::cerr << "ddprun: poll failed: " << std::strerror(errno) << "\n";
      return kExitError;
    }
    if (rc > 0) {
      if (fds[0].revents)
        for (int sig : take_signals()) on_signal(sig);
      for (size_t i = 0; i < streams.size(); ++i)
        if (fds[i + 1].revents) streams[i]->read_available();
      coord_.on_poll(fds.data() + first_link_fd, fds.size() - first_link_fd);
    }
    const double now = now_seconds();
    coord_.tick(now);
    reap();
    if (state_ == State::Running) check_running();
    if (state_ == State::Stopping) check_stopping(now);
  }
}

void Supervisor::apply(const Decision& d) {
  if (exiting_) return;
  const bool remote = d.node >= 0 && d.node != o_.node_rank;
  switch (d.kind) {
    case Decision::Wait:
    case Decision::LastCall:  // node 0's coordinator keeps the time
      break;
    case Decision::Start:
      if (state_ != State::Idle) return;
      run_id_ = d.run_id;
      members_ = d.members;
      restarts_ = d.restarts;
      start_attempt(d.attempt);
      break;
    case Decision::Restart:
      if (remote) std::cerr << "ddprun: node " << d.node << " failed: " << d.why << "\n";
      if (d.node < 0 && !d.why.empty()) {
        std::cerr << "ddprun: " << d.why << "\n";  // a host joined: torchrun's membership change
      } else {
        std::cerr << "ddprun: restarting all workers (restart " << d.restarts << " of "
                  << o_.max_restarts << ")\n";
      }
      restart_to_ = d.attempt;
      if (state_ == State::Running) begin_stop(SIGTERM);
      break;
    case Decision::Exit:
      exiting_ = true;
      exit_ = d;
      restart_to_ = -1;
      if (remote && d.code != 0)
        std::cerr << "ddprun: node " << d.node << " failed: " << d.why
                  << "; stopping this host's workers\n";
      if (state_ == State::Running) begin_stop(SIGTERM);
      break;
  }
}

void Supervisor::reap() {
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;  // orphaned grandchildren handed to ddprun are reaped here too
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& w = workers_[i];
      if (w.pid != pid || w.reaped) continue;
      w.reaped = true;
      w.wait_status = status;
      if (state_ == State::Running && failed_index_ < 0 && status != 0)
        failed_index_ = static_cast<int>(i);
    }
  }
}

void Supervisor::check_running() {
  if (failed_index_ >= 0) {
    const Worker& w = workers_[failed_index_];
    FailureInfo f;
    f.rank = w.rank;
    f.local_rank = w.local_rank;
    f.pid = w.pid;
    f.wait_status = w.wait_status;
    f.time = wall_clock_now();
    if ((o_.redirect | o_.tee) & 2)
      f.log_file = log_root() + "/" + std::to_string(attempt_) + "/rank" + std::to_string(w.rank) +
                   "/stderr.log";
    failure_ = f;
    others_stopped_ = 0;
    for (const auto& other : workers_) others_stopped_ += !other.reaped;
    const std::string what = describe_failure(f, host_);
    std::cerr << "ddprun: " << what << "; stopping "
              << (o_.multi_host() ? "this host's" : "the other") << " workers\n";
    begin_stop(SIGTERM);
    coord_.local_failed(attempt_, exit_code_of(w.wait_status), what);
    return;
  }
  for (const auto& w : workers_)
    if (!w.reaped) return;
  begin_stop(SIGTERM);  // only leftovers of the workers' groups are still there
  coord_.local_finished(attempt_);
}

void Supervisor::begin_stop(int sig) {
  state_ = State::Stopping;
  kill_at_ = now_seconds() + o_.grace_period;
  for (auto& w : workers_) {
    if (!group_alive(w)) continue;
    signal_group(w, sig);
    w.sent_term = w.sent_term || sig == SIGTERM;
  }
}

void Supervisor::check_stopping(double now) {
  bool all_reaped = true, groups_alive = false, pipes_open = false;
  for (auto& w : workers_) {
    all_reaped = all_reaped && w.reaped;
    bool alive = group_alive(w);
    groups_alive = groups_alive || alive;
    // A worker that handled SIGINT and exited may leave children that ignore
    // SIGINT (as background jobs of a shell do); they get SIGTERM.
    if (w.reaped && alive && !w.sent_term && !killed_) {
      signal_group(w, SIGTERM);
      w.sent_term = true;
    }
  }
  for (auto* list : {&out_, &err_})
    for (auto& s : *list) pipes_open = pipes_open || s->open();

  if (!killed_ && now >= kill_at_ && (groups_alive || !all_reaped)) {
    for (auto& w : workers_) signal_group(w, SIGKILL);
    killed_ = true;
  }
  // Processes that left their worker's group and lost their parent are now
  // ddprun's children; once the workers are dead they get SIGKILL too.
  const bool workers_gone = all_reaped && !groups_alive;
  if ((killed_ || (workers_gone && pipes_open)) && now - last_sweep_ >= 0.1) {
    kill_stray_children(workers_);
    last_sweep_ = now;
  }
  if (!workers_gone) return;
  if (pipes_open) {
    if (drain_until_ == 0) drain_until_ = now + kStrayDrainSeconds;
    if (now < drain_until_) return;
  }
  finish_attempt();
}

void Supervisor::finish_attempt() {
  // Each round's victims are reaped, so their own children become ddprun's and
  // are caught by the next round; nothing of this attempt outlives it.
  for (int round = 0; round < 20; ++round) {
    std::vector<pid_t> killed = kill_stray_children(workers_);
    if (killed.empty()) break;
    reap_children(killed, 2.0);
  }
  if (failure_ && failed_index_ >= 0 && static_cast<size_t>(failed_index_) < err_.size()) {
    err_[failed_index_]->close_input();
    failure_->last_stderr = err_[failed_index_]->last_lines();
  }
  out_.clear();  // flushes any last partial lines
  err_.clear();
  if (failure_ && !flight_dir_.empty()) {
    failure_->flight_recorder_dir = flight_dir_;
    failure_->flight_recorder_files = flight_recorder_files(flight_dir_);
  }
  if (flight_dir_made_ && !flight_dir_.empty() &&
      (!failure_ || failure_->flight_recorder_files.empty())) {
    remove_tree(flight_dir_);
  }
  flight_dir_.clear();
  flight_dir_made_ = false;
  remove_tree(rendezvous_dir_);
  rendezvous_dir_.clear();
  workers_.clear();  // their ids may be reused by now
  state_ = State::Idle;
}

void Supervisor::on_signal(int sig) {
  if (sig == SIGCHLD) return;
  if (++signals_seen_ == 1) {
    stop_signal_ = sig;
    std::cerr << "ddprun: got " << signal_name(sig)
              << "; passing it to the workers (send it again to "
              << "kill them at once)\n";
    if (state_ == State::Running) {
      begin_stop(sig);
    } else {
      for (auto& w : workers_) signal_group(w, sig);
    }
    coord_.local_abort(exit_code_for_signal(sig),
                       "stopped by " + signal_name(sig) + " on " + host_);
    return;
  }
  std::cerr << "ddprun: got " << signal_name(sig) << " again; killing the workers\n";
  for (auto& w : workers_) signal_group(w, SIGKILL);
  kill_stray_children(workers_);
  killed_ = true;
}

int Supervisor::finish() {
  const int code = exit_.code;
  if (!exit_.error.empty()) std::cerr << "ddprun: error: " << exit_.error << "\n";
  if (failure_ && code != 0) {
    std::cerr << failure_summary(o_, *failure_, run_id_, restarts_, code, others_stopped_, killed_);
  } else if (stop_signal_ && code == exit_code_for_signal(stop_signal_)) {
    std::cerr << "ddprun: stopped by " << signal_name(stop_signal_) << "; exit code " << code
              << "\n";
  } else if (code != 0 && exit_.node >= 0 && exit_.node != o_.node_rank) {
    std::cerr << "ddprun: exits with code " << code << " because node " << exit_.node
              << " failed\n";
  } else if (code != 0 && exit_.error.empty()) {
    std::cerr << "ddprun: exits with code " << code << "\n";
  }
  std::cerr.flush();
  coord_.shutdown(o_.grace_period + 3);
  return code;
}

}  // namespace ddprun
