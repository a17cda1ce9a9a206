// The side of the control channel on nodes 1..N-1: report to node 0 and do
// what it decides.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "control_channel.h"
#include "signals.h"
#include "sysinfo.h"

namespace ddprun {
namespace {

class AgentCoordinator : public Coordinator {
 public:
  AgentCoordinator(const Options& o, int fd, double join_deadline)
      : o_(o), conn_(fd), join_deadline_(join_deadline),
        where_(o.master_addr + ":" + std::to_string(o.rdzv_port)) {
    conn_.send_line("hello " + std::to_string(o.node_rank) + " " + std::to_string(o.nnodes) + " " +
                    std::to_string(o.nproc_per_node));
  }

  void local_failed(int attempt, int code, const std::string& what) override {
    send("fail " + std::to_string(attempt) + " " + std::to_string(code) + " " + what);
  }
  void local_finished(int attempt) override { send("finished " + std::to_string(attempt)); }
  void local_stopped(int attempt) override { send("stopped " + std::to_string(attempt)); }
  void local_abort(int code, const std::string& what) override {
    send("abort " + std::to_string(code) + " " + what);
    Decision d;
    d.code = code;
    d.node = o_.node_rank;
    d.why = what;
    exit_with(d);
  }

  void add_poll_fds(std::vector<pollfd>& fds) override {
    polled_ = conn_.is_open();
    if (polled_) fds.push_back({conn_.fd(), POLLIN, 0});
  }

  void on_poll(const pollfd* fds, size_t count) override {
    if (!polled_ || count < 1 || !fds[0].revents) return;
    std::vector<std::string> lines;
    bool open = conn_.read_lines(lines);
    for (const auto& line : lines) handle(line);
    if (!open) lost("closed the connection");
  }

  void tick(double now) override {
    if (!conn_.is_open()) return;
    if (!started_ && now > join_deadline_) {
      exit_error(kExitLinkLost, "node 0 at " + where_ + " did not start the job within --rdzv-timeout " +
                                    std::to_string(static_cast<int>(o_.rdzv_timeout)) +
                                    " s; are all " + std::to_string(o_.nnodes) + " hosts started?");
      return;
    }
    if (now - conn_.last_sent >= kPingInterval) send("ping");
    if (now - conn_.last_received > kPeerTimeout) lost("stopped answering");
  }

  void shutdown(double timeout_s) override { conn_.close_gracefully(now_seconds() + timeout_s); }

 private:
  void send(const std::string& line) {
    if (conn_.is_open() && !conn_.send_line(line)) lost("could not be written to");
  }

  void handle(const std::string& line) {
    auto w = split_words(line, 4);
    if (w.empty() || w[0] == "ping" || exiting_) return;
    Decision d;
    if (w[0] == "go" && w.size() >= 3) {
      started_ = true;
      d.kind = Decision::Start;
      d.attempt = number(w[1]);
      d.run_id = w[2];
      decide(d);
    } else if (w[0] == "restart" && w.size() >= 2) {
      d.kind = Decision::Restart;
      d.attempt = number(w[1]);
      d.node = w.size() > 2 ? number(w[2]) : -1;
      d.why = w.size() > 3 ? w[3] : "";
      decide(d);
    } else if (w[0] == "abort" && w.size() >= 3) {
      d.code = number(w[1]);
      d.node = number(w[2]);
      d.why = w.size() > 3 ? w[3] : "";
      exit_with(d);
    } else if (w[0] == "done") {
      exit_with(d);
    } else if (w[0] == "error") {
      exit_error(kExitUsage, "node 0 at " + where_ + " refused this host: " + line.substr(6));
    }
  }

  static int number(const std::string& s) { return std::atoi(s.c_str()); }

  void lost(const std::string& how) {
    conn_.close();
    if (exiting_) return;
    exit_error(kExitLinkLost, "the connection to node 0's ddprun at " + where_ + " " + how +
                                  (started_ ? "" : " before the job started") +
                                  "; stopping this host's workers");
  }

  void exit_error(int code, const std::string& error) {
    Decision d;
    d.code = code;
    d.error = error;
    exit_with(d);
  }

  void exit_with(const Decision& d) {
    if (exiting_) return;
    exiting_ = true;
    decide(d);
  }

  const Options& o_;
  Connection conn_;
  double join_deadline_;
  std::string where_;
  bool polled_ = false;
  bool started_ = false;
  bool exiting_ = false;
};

// Sleeps up to `seconds`; returns a stop signal caught meanwhile, else 0.
int nap(double seconds) {
  pollfd p{signal_pipe_fd(), POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(seconds * 1000)) > 0)
    for (int sig : take_signals())
      if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) return sig;
  return 0;
}

}  // namespace

std::unique_ptr<Coordinator> make_agent_coordinator(const Options& o, int& exit_code) {
  const double deadline = now_seconds() + o.rdzv_timeout;
  const std::string where = o.master_addr + ":" + std::to_string(o.rdzv_port);
  bool told = false;
  for (;;) {
    std::string error;
    double left = deadline - now_seconds();
    int fd = connect_tcp(o.master_addr, o.rdzv_port, left < 2 ? (left > 0.1 ? left : 0.1) : 2, error);
    if (fd >= 0) {
      std::cerr << "ddprun: node " << o.node_rank << " joined node 0 at " << where << "\n";
      return std::make_unique<AgentCoordinator>(o, fd, deadline);
    }
    if (now_seconds() >= deadline) {
      std::cerr << "ddprun: error: could not reach node 0's ddprun at " << where << " within "
                << "--rdzv-timeout " << o.rdzv_timeout << " s (last error: " << error << "). "
                << "Check that ddprun runs on node 0 with --master-addr " << o.master_addr
                << " and the same --master-port/--rdzv-port, that this host can reach "
                << o.master_addr << ", and that no firewall blocks port " << o.rdzv_port << ".\n";
      exit_code = kExitLinkLost;
      return nullptr;
    }
    if (!told) {
      std::cerr << "ddprun: node " << o.node_rank << " waiting for node 0 at " << where << " ("
                << error << "); retrying for up to " << o.rdzv_timeout << " s\n";
      told = true;
    }
    if (int sig = nap(0.5)) {
      exit_code = exit_code_for_signal(sig);
      return nullptr;
    }
  }
}

}  // namespace ddprun
