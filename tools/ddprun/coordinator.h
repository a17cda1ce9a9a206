// Who decides, for the whole job, whether to start, restart or stop workers.
// On one host ddprun decides alone; on several hosts node 0's ddprun decides
// and the others follow (see control_channel.h), or, once node 0 is lost, the
// host that took over (Note [A new coordinator] in coordinator_agent.cpp). Either way the decisions are
// the job policy's (job_policy.h); a coordinator only carries events to it and
// its decisions to the supervisor and the other hosts.
#pragma once

#include <poll.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "job_policy.h"

namespace ddprun {

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

// The coordinator of the host that decides: feeds this host's events to a
// JobPolicy, and passes each decision on (announce() first, to other hosts).
class DecidingCoordinator : public Coordinator {
 public:
  // `min_nodes` < `nnodes`: torchrun's --nnodes MIN:MAX (see JobPolicy). `self`: this
  // host's node rank (0, or a host that took over after node 0 was lost).
  DecidingCoordinator(int nnodes, int max_restarts, std::string run_id, int min_nodes = 0,
                      int self = 0);

  void local_failed(int attempt, int code, const std::string& what) override;
  void local_finished(int attempt) override;
  void local_stopped(int attempt) override;
  void local_abort(int code, const std::string& what) override;

  // Decides on `e`: an event of this host (node 0), or one another host reported.
  void handle(const Event& e);
  // This host goes on as the coordinator after `lost` was lost (JobPolicy::take_over).
  void take_over(const std::vector<int>& last_members, const std::set<int>& gone, int lost,
                 int attempt, int restarts, const std::string& why);

 protected:
  virtual void announce(const Decision& d) { (void)d; }
  const JobPolicy& policy() const { return policy_; }
  int self() const { return self_; }

 private:
  void pass_on(Decision d);

  JobPolicy policy_;
  int self_;
};

std::unique_ptr<Coordinator> make_local_coordinator(int max_restarts, const std::string& run_id);

}  // namespace ddprun
