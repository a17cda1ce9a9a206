// The side of the control channel on nodes 1..N-1: report to node 0 and do
// what it decides.
#include <signal.h>
#include <unistd.h>

#include <iostream>

#include "control_channel.h"
#include "signals.h"
#include "sysinfo.h"
#include "wire.h"

namespace ddprun {
namespace {

class AgentCoordinator : public Coordinator {
 public:
  AgentCoordinator(Options& o, int fd, double join_deadline)
      : o_(o),
        conn_(fd),
        join_deadline_(join_deadline),
        where_(o.master_addr + ":" + std::to_string(o.rdzv_port)) {
    conn_.send_line(encode(AgentMessage::introduce(
        {o.node_rank, o.nnodes, o.nproc_per_node, o.run_id_given ? o.run_id : "", o.min_nodes})));
  }

  // Node 0 decides on these; the node of each event is the connection's.
  void local_failed(int attempt, int code, const std::string& what) override {
    report(Event::worker_failed(o_.node_rank, attempt, code, what));
  }
  void local_finished(int attempt) override {
    report(Event::workers_finished(o_.node_rank, attempt));
  }
  void local_stopped(int attempt) override {
    report(Event::workers_stopped(o_.node_rank, attempt));
  }
  // A host that stops for good does not wait for node 0 to agree.
  void local_abort(int code, const std::string& what) override {
    report(Event::aborted(o_.node_rank, code, what));
    Decision d;
    d.kind = Decision::Exit;
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
      exit_error(kExitLinkLost, "node 0 at " + where_ +
                                    " did not start the job within --rdzv-timeout " +
                                    std::to_string(static_cast<int>(o_.rdzv_timeout)) +
                                    " s; are all " + std::to_string(o_.nnodes) + " hosts started?");
      return;
    }
    if (now - conn_.last_sent >= kPingInterval) send(encode(AgentMessage::ping()));
    if (now - conn_.last_received > kPeerTimeout) lost("stopped answering");
  }

  void shutdown(double timeout_s) override { conn_.close_gracefully(now_seconds() + timeout_s); }

 private:
  void send(const std::string& line) {
    if (conn_.is_open() && !conn_.send_line(line)) lost("could not be written to");
  }
  void report(const Event& e) { send(encode(AgentMessage::report(e))); }

  void handle(const std::string& line) {
    if (exiting_) return;
    const Node0Message m = decode_node0_message(line);
    if (m.kind == Node0Message::Order) {
      const Decision& d = m.decision;
      if (d.kind == Decision::Exit) {
        exit_with(d);
        return;
      }
      if (d.kind == Decision::Start && o_.node_rank < 0) {
        exit_error(kExitError,
                   "node 0 at " + where_ + " started the job without giving this host a node rank");
        return;
      }
      started_ = started_ || d.kind == Decision::Start;
      decide(d);
    } else if (m.kind == Node0Message::Welcome) {
      // c10d: this host's node rank, which its workers' ranks derive from.
      if (o_.node_rank < 0 && m.node > 0) {
        o_.node_rank = m.node;
        std::cerr << "ddprun: this host is node " << m.node << " of " << o_.nnodes << "\n";
      }
    } else if (m.kind == Node0Message::Refusal) {
      exit_error(kExitUsage, "node 0 at " + where_ + " refused this host: " + m.refusal);
    }
  }

  void lost(const std::string& how) {
    conn_.close();
    if (exiting_) return;
    exit_error(kExitLinkLost, "the connection to node 0's ddprun at " + where_ + " " + how +
                                  (started_ ? "" : " before the job started") +
                                  "; stopping this host's workers");
  }

  void exit_error(int code, const std::string& error) {
    Decision d;
    d.kind = Decision::Exit;
    d.code = code;
    d.error = error;
    exit_with(d);
  }

  void exit_with(const Decision& d) {
    if (exiting_) return;
    exiting_ = true;
    decide(d);
  }

  Options& o_;  // node_rank is set when node 0 hands it out (c10d)
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

std::unique_ptr<Coordinator> make_agent_coordinator(Options& o, int& exit_code) {
  const double deadline = now_seconds() + o.rdzv_timeout;
  const std::string where = o.master_addr + ":" + std::to_string(o.rdzv_port);
  bool told = false;
  for (;;) {
    std::string error;
    double left = deadline - now_seconds();
    int fd =
        connect_tcp(o.master_addr, o.rdzv_port, left < 2 ? (left > 0.1 ? left : 0.1) : 2, error);
    if (fd >= 0) {
      if (o.node_rank >= 0)
        std::cerr << "ddprun: node " << o.node_rank << " joined node 0 at " << where << "\n";
      else
        std::cerr << "ddprun: joined node 0 at " << where << "; waiting for a node rank\n";
      return std::make_unique<AgentCoordinator>(o, fd, deadline);
    }
    if (now_seconds() >= deadline) {
      std::cerr << "ddprun: error: could not reach node 0's ddprun at " << where << " within "
                << "--rdzv-timeout " << o.rdzv_timeout << " s (last error: " << error << "). "
                << "Check that ddprun runs on node 0 with "
                << (o.dynamic_rank() ? "the same --rdzv-endpoint"
                                     : "--master-addr " + o.master_addr +
                                           " and the same --master-port/--rdzv-port")
                << ", that this host can reach " << o.master_addr
                << ", and that no firewall blocks port " << o.rdzv_port << ".\n";
      exit_code = kExitLinkLost;
      return nullptr;
    }
    if (!told) {
      std::cerr << "ddprun: "
                << (o.node_rank >= 0 ? "node " + std::to_string(o.node_rank) : "this host")
                << " waiting for node 0 at " << where << " (" << error << "); retrying for up to "
                << o.rdzv_timeout << " s\n";
      told = true;
    }
    if (int sig = nap(0.5)) {
      exit_code = exit_code_for_signal(sig);
      return nullptr;
    }
  }
}

}  // namespace ddprun
