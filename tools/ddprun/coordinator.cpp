#include "coordinator.h"

namespace ddprun {

// The deciding host is node 0 (the only node on a single host).
DecidingCoordinator::DecidingCoordinator(int nnodes, int max_restarts, std::string run_id,
                                         int min_nodes)
    : policy_(nnodes, max_restarts, std::move(run_id), min_nodes) {}

void DecidingCoordinator::local_failed(int attempt, int code, const std::string& what) {
  handle(Event::worker_failed(0, attempt, code, what));
}

void DecidingCoordinator::local_finished(int attempt) {
  handle(Event::workers_finished(0, attempt));
}
void DecidingCoordinator::local_stopped(int attempt) { handle(Event::workers_stopped(0, attempt)); }

void DecidingCoordinator::local_abort(int code, const std::string& what) {
  handle(Event::aborted(0, code, what));
}

void DecidingCoordinator::handle(const Event& e) {
  Decision d = policy_.on(e);
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
