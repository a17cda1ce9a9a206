#include "coordinator.h"

namespace ddprun {
namespace {

class LocalCoordinator : public Coordinator {
 public:
  LocalCoordinator(int max_restarts, std::string run_id)
      : max_restarts_(max_restarts), run_id_(std::move(run_id)) {
    start(0);
  }

  void local_failed(int attempt, int code, const std::string& what) override {
    Decision d;
    d.node = 0;
    d.why = what;
    if (attempt < max_restarts_) {
      d.kind = Decision::Restart;
      d.attempt = attempt + 1;
    } else {
      d.kind = Decision::Exit;
      d.code = code;
    }
    decide(d);
  }

  void local_finished(int) override { decide(Decision{}); }
  void local_stopped(int attempt) override { start(attempt); }

  void local_abort(int code, const std::string& what) override {
    Decision d;
    d.code = code;
    d.why = what;
    decide(d);
  }

 private:
  void start(int attempt) {
    Decision d;
    d.kind = Decision::Start;
    d.attempt = attempt;
    d.run_id = run_id_;
    decide(d);
  }

  int max_restarts_;
  std::string run_id_;
};

}  // namespace

std::unique_ptr<Coordinator> make_local_coordinator(int max_restarts, const std::string& run_id) {
  return std::make_unique<LocalCoordinator>(max_restarts, run_id);
}

}  // namespace ddprun
