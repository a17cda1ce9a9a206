// Who decides, for the whole job, whether to start, restart or stop workers.
// On one host ddprun decides alone; on several hosts node 0's ddprun decides
// and the others follow (see control_channel.h).
#pragma once

#include <poll.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace ddprun {

struct Decision {
  enum Kind { Start, Restart, Exit } kind = Exit;
  int attempt = 0;     // Start, Restart: the attempt to run next
  int code = 0;        // Exit: ddprun's exit code
  int node = -1;       // Start, Restart, Exit: the node whose failure caused it, if any
  std::string run_id;  // Start
  std::string why;     // Restart, Exit: what failed, to print
  std::string error;   // Exit: a job-level error to print (e.g. a host never joined)
};

class Coordinator {
 public:
  virtual ~Coordinator() = default;

  // What the local workers did in `attempt`; `what` describes a failure.
  virtual void local_failed(int attempt, int code, const std::string& what) = 0;
  virtual void local_finished(int attempt) = 0;
  // All local workers are gone after a Restart decision for `attempt`.
  virtual void local_stopped(int attempt) = 0;
  // This host stops for good (a signal); nothing is restarted.
  virtual void local_abort(int code, const std::string& what) = 0;

  // Poll integration for coordinators that talk to other hosts.
  virtual void add_poll_fds(std::vector<pollfd>& fds) { (void)fds; }
  virtual void on_poll(const pollfd* fds, size_t count) { (void)fds, (void)count; }
  virtual void tick(double now) { (void)now; }
  // Before ddprun exits: lets the other hosts read the last messages.
  virtual void shutdown(double timeout_s) { (void)timeout_s; }

  bool next(Decision& d) {
    if (decisions_.empty()) return false;
    d = std::move(decisions_.front());
    decisions_.pop_front();
    return true;
  }

 protected:
  void decide(Decision d) { decisions_.push_back(std::move(d)); }

 private:
  std::deque<Decision> decisions_;
};

std::unique_ptr<Coordinator> make_local_coordinator(int max_restarts, const std::string& run_id);

}  // namespace ddprun
