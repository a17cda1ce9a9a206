#include "coordinator.h"

namespace ddprun {

// The deciding host is node 0 (the only node on a single host).
DecidingCoordinator::DecidingCoordinator(int nnodes, int max_restarts, std::string run_id,
                                         int min_nodes, int self)
    : policy_(nnodes, max_restarts, std::move(run_id), min_nodes), self_(self) {}

void DecidingCoordinator::local_failed(int attempt, int code, const std::string& what) {
  handle(Event::worker_failed(self_, attempt, code, what));
}

void DecidingCoordinator::local_finished(int attempt) {
  handle(Event::workers_finished(self_, attempt));
}
void DecidingCoordinator::local_stopped(int attempt) {
  handle(Event::workers_stopped(self_, attempt));
}

void DecidingCoordinator::local_abort(int code, const std::string& what) {
  handle(Event::aborted(self_, code, what));
}

void DecidingCoordinator::handle(const Event& e) { pass_on(policy_.on(e)); }

void DecidingCoordinator::take_over(const std::vector<int>& last_members, const std::set<int>& gone,
                                    int lost, int attempt, int restarts, const std::string& why) {
  pass_on(policy_.take_over(self_, last_members, gone, lost, attempt, restarts, why));
}

void DecidingCoordinator::pass_on(Decision d) {
  if (d.kind == Decision::Wait) return;
  announce(d);
  decide(std::move(d));
}

std::unique_ptr<Coordinator> make_local_coordinator(int max_restarts, const std::string& run_id) {
  auto coordinator = std::make_unique<DecidingCoordinator>(1, max_restarts, run_id);
  coordinator->handle(Event::joined(0));  // the only node: the workers start at once
  return coordinator;
}

}  // namespace ddprun
