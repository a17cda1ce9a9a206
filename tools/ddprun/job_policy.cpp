#include "job_policy.h"

#include <algorithm>

#include "exit_codes.h"

namespace ddprun {

Event Event::joined(int node) {
  Event e;
  e.kind = NodeJoined;
  e.node = node;
  return e;
}

Event Event::join_timed_out(const std::string& error) {
  Event e;
  e.kind = JoinTimedOut;
  e.node = -1;
  e.why = error;
  return e;
}

Event Event::worker_failed(int node, int attempt, int code, const std::string& what) {
  Event e;
  e.kind = WorkerFailed;
  e.node = node;
  e.attempt = attempt;
  e.code = code;
  e.why = what;
  return e;
}

Event Event::workers_finished(int node, int attempt) {
  Event e;
  e.kind = WorkersFinished;
  e.node = node;
  e.attempt = attempt;
  return e;
}

Event Event::workers_stopped(int node, int attempt) {
  Event e;
  e.kind = WorkersStopped;
  e.node = node;
  e.attempt = attempt;
  return e;
}

Event Event::aborted(int node, int code, const std::string& what) {
  Event e;
  e.kind = Aborted;
  e.node = node;
  e.code = code;
  e.why = what;
  return e;
}

Event Event::node_lost(int node, const std::string& how) {
  Event e;
  e.kind = NodeLost;
  e.node = node;
  e.why = how;
  return e;
}

Event Event::last_call_over() {
  Event e;
  e.kind = LastCallOver;
  return e;
}

JobPolicy::JobPolicy(int nnodes, int max_restarts, std::string run_id, int min_nodes)
    : nnodes_(nnodes),
      min_nodes_(min_nodes > 0 && min_nodes < nnodes ? min_nodes : nnodes),
      max_restarts_(max_restarts),
      run_id_(std::move(run_id)) {}

Decision JobPolicy::on(const Event& e) {
  if (over_) return {};
  switch (e.kind) {
    case Event::NodeJoined: {
      if (started()) {
        if (!elastic() || member(e.node) || waiting_.count(e.node) || present() >= nnodes_)
          return {};
        waiting_.insert(e.node);
        // torchrun's membership change: the running workers restart to take it in.
        if (restart_decided_ || !finished_nodes_.empty()) return {};
        return restart(attempt_ + 1, -1,
                       "node " + std::to_string(e.node) +
                           " joined; restarting the workers to admit it (a membership "
                           "change, not counted against --max-restarts)");
      }
      joined_nodes_.insert(e.node);
      const int joined = static_cast<int>(joined_nodes_.size());
      if (joined >= nnodes_) return start(0);
      if (joined < min_nodes_ || last_call_) return {};
      last_call_ = true;
      Decision d;
      d.kind = Decision::LastCall;
      return d;
    }

    case Event::LastCallOver:
      if (started()) return {};
      if (static_cast<int>(joined_nodes_.size()) < min_nodes_) {
        last_call_ = false;  // a host left meanwhile: the next MIN-th join calls again
        return {};
      }
      return start(0);

    case Event::JoinTimedOut: {
      if (started()) return {};
      Decision d = exit(kExitLinkLost, -1, "");
      d.error = e.why;
      return d;
    }

    case Event::WorkerFailed:
      // Reports of an earlier attempt, or of one already being restarted, come
      // from hosts that saw the same failure late.
      if (e.attempt != attempt_ || restart_decided_) return {};
      if (restarts_used_ >= max_restarts_) return exit(e.code, e.node, e.why);
      ++restarts_used_;
      return restart(e.attempt + 1, e.node, e.why);

    case Event::WorkersFinished:
      // A host whose workers succeeded still takes part in a restart that a
      // failure elsewhere brings, so success counts only once every host had it.
      if (e.attempt != attempt_ || restart_decided_) return {};
      finished_nodes_.insert(e.node);
      if (!all_members_in(finished_nodes_)) return {};
      return exit(0, -1, "");

    case Event::WorkersStopped:
      // The next attempt starts only when no worker of the last one is left
      // anywhere, so the two never meet at the rendezvous.
      if (e.attempt != next_attempt_) return {};
      stopped_nodes_.insert(e.node);
      if (!all_members_in(stopped_nodes_)) return {};
      return start(e.attempt);

    case Event::Aborted:
      return exit(e.code, e.node, e.why);

    case Event::NodeLost:
      if (!elastic()) return exit(kExitLinkLost, e.node, e.why);
      return member_lost(e);
  }
  return {};
}

// MIN:MAX: the job goes on without a lost node while enough are left.
Decision JobPolicy::member_lost(const Event& e) {
  if (!started()) {
    joined_nodes_.erase(e.node);  // the last call, if any, still runs; its end checks again
    return {};
  }
  if (waiting_.erase(e.node) || !member(e.node)) return {};
  members_.erase(e.node);
  if (Decision d = too_few(e.node, e.why); d.kind == Decision::Exit) return d;
  if (restart_decided_)  // it may have been the last one the restart waited for
    return all_members_in(stopped_nodes_) ? start(next_attempt_) : Decision{};
  if (restarts_used_ >= max_restarts_) return exit(kExitLinkLost, e.node, e.why);
  ++restarts_used_;
  return restart(attempt_ + 1, e.node, e.why);
}

Decision JobPolicy::too_few(int node, const std::string& why) {
  const int left = static_cast<int>(members_.size());
  if (left < min_nodes_)
    return exit(kExitLinkLost, node,
                why + "; fewer than " + std::to_string(min_nodes_) +
                    " nodes (--nnodes MIN) are left");
  if (!quorum(members_))
    return exit(kExitLinkLost, node,
                why + "; " + std::to_string(left) + " of the " +
                    std::to_string(last_start_.size()) +
                    " nodes of the last attempt are left, not a majority: a lost node and a "
                    "network split look the same from here, and the other side may go on");
  return {};
}

bool quorum_of(const std::set<int>& last, const std::set<int>& nodes) {
  size_t in = 0;
  for (int n : nodes) in += last.count(n);
  if (2 * in != last.size()) return 2 * in > last.size();
  return !last.empty() && nodes.count(*last.begin()) > 0;  // group 0: the lowest node rank
}

int JobPolicy::next_node() const {
  int top = 0;
  for (const auto* s : {&joined_nodes_, &members_, &last_start_, &waiting_})
    if (!s->empty()) top = std::max(top, *s->rbegin());
  return top + 1;
}

Decision JobPolicy::take_over(int self, const std::vector<int>& last_members,
                              const std::set<int>& gone, int lost, int attempt, int restarts_used,
                              const std::string& why) {
  last_start_ = std::set<int>(last_members.begin(), last_members.end());
  members_ = last_start_;
  for (int n : gone) members_.erase(n);
  members_.erase(lost);
  members_.insert(self);
  attempt_ = attempt;
  restarts_used_ = restarts_used;
  finished_nodes_.clear();
  if (Decision d = too_few(lost, why); d.kind == Decision::Exit) return d;
  if (restarts_used_ >= max_restarts_)
    return exit(kExitLinkLost, lost,
                why + "; no restart is left (--max-restarts " + std::to_string(max_restarts_) +
                    ")");
  ++restarts_used_;
  return restart(attempt + 1, lost, why);
}

bool JobPolicy::all_members_in(const std::set<int>& nodes) const {
  for (int n : members_)
    if (!nodes.count(n)) return false;
  return true;
}

Decision JobPolicy::restart(int attempt, int node, const std::string& why) {
  restart_decided_ = true;
  next_attempt_ = attempt;
  stopped_nodes_.clear();
  Decision d;
  d.kind = Decision::Restart;
  d.attempt = attempt;
  d.node = node;
  d.why = why;
  d.restarts = restarts_used_;
  return d;
}

Decision JobPolicy::start(int attempt) {
  if (attempt == 0) members_ = joined_nodes_;
  for (int n : waiting_)
    if (static_cast<int>(members_.size()) < nnodes_) members_.insert(n);
  waiting_.clear();
  last_start_ = members_;
  attempt_ = attempt;
  restart_decided_ = false;
  finished_nodes_.clear();
  Decision d;
  d.kind = Decision::Start;
  d.attempt = attempt;
  d.run_id = run_id_;
  d.restarts = restarts_used_;
  if (elastic()) d.members.assign(members_.begin(), members_.end());
  return d;
}

Decision JobPolicy::exit(int code, int node, const std::string& why) {
  over_ = true;
  Decision d;
  d.kind = Decision::Exit;
  d.code = code;
  d.node = node;
  d.why = why;
  return d;
}

}  // namespace ddprun
