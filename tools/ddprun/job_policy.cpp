#include "job_policy.h"

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

JobPolicy::JobPolicy(int nnodes, int max_restarts, std::string run_id)
    : nnodes_(nnodes), max_restarts_(max_restarts), run_id_(std::move(run_id)) {}

Decision JobPolicy::on(const Event& e) {
  if (over_) return {};
  switch (e.kind) {
    case Event::NodeJoined:
      if (started()) return {};
      joined_nodes_.insert(e.node);
      if (static_cast<int>(joined_nodes_.size()) < nnodes_) return {};
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
      if (e.attempt >= max_restarts_) return exit(e.code, e.node, e.why);
      restart_decided_ = true;
      next_attempt_ = e.attempt + 1;
      stopped_nodes_.clear();
      {
        Decision d;
        d.kind = Decision::Restart;
        d.attempt = next_attempt_;
        d.node = e.node;
        d.why = e.why;
        return d;
      }

    case Event::WorkersFinished:
      // A host whose workers succeeded still takes part in a restart that a
      // failure elsewhere brings, so success counts only once every host had it.
      if (e.attempt != attempt_ || restart_decided_) return {};
      finished_nodes_.insert(e.node);
      if (static_cast<int>(finished_nodes_.size()) < nnodes_) return {};
      return exit(0, -1, "");

    case Event::WorkersStopped:
      // The next attempt starts only when no worker of the last one is left
      // anywhere, so the two never meet at the rendezvous.
      if (e.attempt != next_attempt_) return {};
      stopped_nodes_.insert(e.node);
      if (static_cast<int>(stopped_nodes_.size()) < nnodes_) return {};
      return start(e.attempt);

    case Event::Aborted:
      return exit(e.code, e.node, e.why);

    case Event::NodeLost:
      return exit(kExitLinkLost, e.node, e.why);
  }
  return {};
}

Decision JobPolicy::start(int attempt) {
  attempt_ = attempt;
  restart_decided_ = false;
  finished_nodes_.clear();
  Decision d;
  d.kind = Decision::Start;
  d.attempt = attempt;
  d.run_id = run_id_;
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
