// The side of the control channel on nodes 1..N-1: report to node 0 and do
// what it decides.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <set>

#include "control_channel.h"
#include "signals.h"
#include "sysinfo.h"
#include "wire.h"

namespace ddprun {
namespace {

// Note [A new coordinator]
// With --nnodes MIN:MAX, node 0 is not needed to go on. Before each start node 0 sends
// every member the members' addresses (as it sees them on the control channel). When
// the link to the coordinator is lost after a start, each member stops its workers and
// turns to the lowest node rank left among the last attempt's members, which is the
// group 0 of the next attempt: that host listens on its own address at --rdzv-port and
// takes over the job policy (JobPolicy::take_over); every other member connects there
// and rejoins, trying for the takeover window (Options::takeover_window) before it
// turns to the next node rank. The workers' MASTER_ADDR becomes the new coordinator's
// address. Whether the job goes on is the quorum rule's (Note [A quorum of the last
// attempt]), so that two sides of a network split never both do; a member checks it
// first with what it knows, and stops with the cause and the command to resume when it
// cannot hold.
class AgentCoordinator : public Coordinator {
 public:
  // `rejoin`: this host connects to a new coordinator after the old one was lost.
  AgentCoordinator(Options& o, int fd, double join_deadline, const JobView* rejoin = nullptr)
      : o_(o),
        conn_(std::make_unique<Connection>(fd, secret(), auth::Role::Agent)),
        join_deadline_(join_deadline),
        retry_until_(rejoin ? now_seconds() + o.takeover_window() : join_deadline),
        where_(o.master_addr + ":" + std::to_string(o.rdzv_port)) {
    if (rejoin) {
      view_ = *rejoin;
      started_ = true;
      first_line_ = encode(AgentMessage::rejoining({o.node_rank, view_.attempt, view_.run_id}));
    } else {
      first_line_ = encode(AgentMessage::introduce(
          {o.node_rank, o.nnodes, o.nproc_per_node, o.run_id_given ? o.run_id : "", o.min_nodes}));
    }
    conn_->send_line(first_line_);
  }

  // Node 0 decides on these; the node of each event is the connection's.
  void local_failed(int attempt, int code, const std::string& what) override {
    if (next_) return forward([&] { next_->local_failed(attempt, code, what); });
    report(Event::worker_failed(o_.node_rank, attempt, code, what));
  }
  void local_finished(int attempt) override {
    if (next_) return forward([&] { next_->local_finished(attempt); });
    report(Event::workers_finished(o_.node_rank, attempt));
  }
  void local_stopped(int attempt) override {
    if (next_) return forward([&] { next_->local_stopped(attempt); });
    if (failing_over_) stopped_ = attempt;  // told to the next coordinator once found
    report(Event::workers_stopped(o_.node_rank, attempt));
  }
  // A host that stops for good does not wait for node 0 to agree.
  void local_abort(int code, const std::string& what) override {
    if (next_) return forward([&] { next_->local_abort(code, what); });
    report(Event::aborted(o_.node_rank, code, what));
    Decision d;
    d.kind = Decision::Exit;
    d.code = code;
    d.node = o_.node_rank;
    d.why = what;
    exit_with(d);
  }

  void add_poll_fds(std::vector<pollfd>& fds) override {
    if (next_) return next_->add_poll_fds(fds);
    polled_ = conn_->is_open();
    if (polled_) fds.push_back({conn_->fd(), POLLIN, 0});
  }

  void on_poll(const pollfd* fds, size_t count) override {
    if (next_) return forward([&] { next_->on_poll(fds, count); });
    if (!polled_ || count < 1 || !fds[0].revents) return;
    std::vector<std::string> lines;
    bool open = conn_->read_lines(lines);
    for (const auto& line : lines) handle(line);
    if (!open && conn_->is_open()) broken();
  }

  void tick(double now) override {
    if (next_) return forward([&] { next_->tick(now); });
    if (failing_over_) return find_coordinator(now);
    if (reconnect_at_ > 0) {
      if (now >= reconnect_at_) reconnect(now);
      return;
    }
    if (!conn_->is_open()) return;
    if (!conn_->authenticated() && now - conn_->opened > 2 * kHandshakeTimeout) {
      conn_->close();
      if (may_retry(now)) return retry_later("did not finish the authentication");
      return lost("did not finish the authentication within " +
                  std::to_string(static_cast<int>(2 * kHandshakeTimeout)) + " s");
    }
    if (!started_ && now > join_deadline_) {
      exit_error(kExitLinkLost, "node 0 at " + where_ +
                                    " did not start the job within --rdzv-timeout " +
                                    std::to_string(static_cast<int>(o_.rdzv_timeout)) +
                                    " s; are all " + std::to_string(o_.nnodes) + " hosts started?");
      return;
    }
    if (now - conn_->last_sent >= o_.keep_alive_interval) send(encode(AgentMessage::ping()));
    if (now - conn_->last_received > o_.peer_timeout())
      lost("stopped answering (silent for " + seconds_text(o_.peer_timeout()) + ")");
  }

  void shutdown(double timeout_s) override {
    if (next_) return next_->shutdown(timeout_s);
    conn_->close_gracefully(now_seconds() + timeout_s);
  }

 private:
  const auth::Bytes* secret() const { return o_.secret.empty() ? nullptr : &o_.secret; }

  void send(const std::string& line) {
    if (conn_->is_open() && !conn_->send_line(line)) lost("could not be written to");
  }

  // The coordinator closed the connection, or broke the protocol: a failed handshake
  // ends this host (the hosts' secrets differ); a line that fails its check counts as
  // losing the coordinator. A connection closed before the handshake ended (the
  // coordinator turns away connections beyond kMaxUnjoined) is tried again.
  void broken() {
    const std::string who = "node " + std::to_string(view_.coordinator);
    const std::string text = conn_->failure_text();
    switch (conn_->failure()) {
      case Connection::Failure::Handshake:
        std::cerr << "ddprun: refused " << who << " at " << conn_->peer()
                  << ": authentication failed: " << text << "\n";
        conn_->close();
        return exit_error(kExitUsage, who + " at " + where_ +
                                          " failed the authentication: " + text +
                                          ". Every host of the job must give the same "
                                          "--rdzv-secret-file (docs/security.md).");
      case Connection::Failure::Line:
      case Connection::Failure::TooLong:
        std::cerr << "ddprun: refused a line from " << who << " at " << conn_->peer() << ": "
                  << text << "; closed the connection\n";
        return lost(conn_->failure() == Connection::Failure::Line
                        ? "sent a line that failed its authentication check"
                        : "sent a line longer than the protocol allows");
      case Connection::Failure::None:
        break;
    }
    const double now = now_seconds();
    if (may_retry(now)) {
      conn_->close();
      return retry_later("closed the connection before the authentication ended");
    }
    lost("closed the connection");
  }

  bool may_retry(double now) const {
    return secret() && !conn_->authenticated() && !exiting_ && now < retry_until_;
  }

  void retry_later(const std::string& how) {
    if (!retry_told_)
      std::cerr << "ddprun: node " << view_.coordinator << " at " << where_ << " " << how
                << " (busy with other connections?); trying again\n";
    retry_told_ = true;
    reconnect_at_ = now_seconds() + 0.5;
  }

  void reconnect(double now) {
    std::string error;
    const int fd = connect_tcp(o_.master_addr, o_.rdzv_port, 1.0, error);
    if (fd >= 0) {
      reconnect_at_ = 0;
      conn_ = std::make_unique<Connection>(fd, secret(), auth::Role::Agent);
      conn_->send_line(first_line_);
      return;
    }
    reconnect_at_ = now + 0.5;
    if (now < retry_until_) return;
    reconnect_at_ = 0;
    lost("could not be reached again (" + error + ")");
  }
  void report(const Event& e) { send(encode(AgentMessage::report(e))); }

  void handle(const std::string& line) {
    if (exiting_) return;
    const Node0Message m = decode_node0_message(line);
    if (m.kind == Node0Message::Order) {
      Decision d = m.decision;
      if (d.kind == Decision::Exit) {
        if (d.node == o_.node_rank && d.code != 0) {  // this host was dropped
          d.error = d.why;
          d.why.clear();
        }
        exit_with(d);
        return;
      }
      if (d.kind == Decision::Start && o_.node_rank < 0) {
        exit_error(kExitError,
                   "node 0 at " + where_ + " started the job without giving this host a node rank");
        return;
      }
      if (d.kind == Decision::Start) {
        view_.run_id = d.run_id;
        view_.attempt = d.attempt;
        view_.members = d.members;
        view_.gone.clear();
      }
      view_.restarts = std::max(view_.restarts, d.restarts);
      started_ = started_ || d.kind == Decision::Start;
      decide(d);
    } else if (m.kind == Node0Message::PeerList) {
      // Before a start: the new members; before a restart: the members left.
      view_.peers = m.peers;
      view_.gone.clear();
      for (int n : view_.members)
        if (view_.address(n).empty()) view_.gone.push_back(n);
    } else if (m.kind == Node0Message::Welcome) {
      // c10d: this host's node rank, which its workers' ranks derive from.
      if (o_.node_rank < 0 && m.node > 0) {
        o_.node_rank = m.node;
        std::cerr << "ddprun: this host is node " << m.node << " of " << o_.nnodes << "\n";
      }
    } else if (m.kind == Node0Message::Refusal) {
      exit_error(kExitUsage, "node " + std::to_string(view_.coordinator) + " at " + where_ +
                                 " refused this host: " + m.refusal);
    }
  }

  void lost(const std::string& how) {
    conn_->close();
    if (exiting_) return;
    const std::string who = "node " + std::to_string(view_.coordinator);
    const std::string cause =
        who + "'s ddprun at " + where_ + " " + how + (started_ ? "" : " before the job started");
    const std::string why_not = why_no_takeover();
    if (!why_not.empty()) {
      exit_error(kExitLinkLost, cause + ", and the others cannot go on without it: " + why_not +
                                    ". " + resume_hint());
      return;
    }
    // Note [A new coordinator]: stop the workers now; the next coordinator restarts them.
    std::set<int> gone(view_.gone.begin(), view_.gone.end());
    gone.insert(view_.coordinator);
    candidates_.clear();
    for (int n : view_.members)
      if (!gone.count(n)) candidates_.push_back(n);
    candidate_ = 0;
    failing_over_ = true;
    failover_attempt_ = view_.attempt + 1;
    lost_why_ = "its ddprun " + how + " (host down, ddprun killed, or network lost)";
    deadline_ = now_seconds() + o_.takeover_window();
    std::cerr << "ddprun: " << cause << "; node " << candidates_[0]
              << " (the lowest node rank left) takes over as the coordinator\n";
    Decision d;
    d.kind = Decision::Restart;
    d.attempt = failover_attempt_;
    d.node = view_.coordinator;
    d.restarts = view_.restarts + 1;
    d.why = lost_why_;
    decide(d);
  }

  // Why this host cannot go on after its coordinator was lost; "" when it can try.
  std::string why_no_takeover() const {
    if (!o_.dynamic_rank() || o_.min_nodes >= o_.nnodes)
      return "with a fixed --nnodes every host is needed (--nnodes MIN:MAX with --rdzv-backend "
             "c10d lets the others go on without one)";
    if (!started_ || view_.attempt < 0) return "the job had not started yet";
    const bool member =
        std::find(view_.members.begin(), view_.members.end(), o_.node_rank) != view_.members.end();
    if (!member) return "this host was waiting to join and took no part in the last attempt";
    if (view_.restarts >= o_.max_restarts)
      return "no restart is left (--max-restarts " + std::to_string(o_.max_restarts) + ")";
    std::set<int> last(view_.members.begin(), view_.members.end()), left = last;
    for (int n : view_.gone) left.erase(n);
    left.erase(view_.coordinator);
    for (int n : left)
      if (view_.address(n).empty()) return "node " + std::to_string(n) + "'s address is unknown";
    if (static_cast<int>(left.size()) < o_.min_nodes)
      return "at most " + std::to_string(left.size()) + " host(s) are left, fewer than " +
             std::to_string(o_.min_nodes) + " (--nnodes MIN)";
    if (!quorum_of(last, left))
      return "at most " + std::to_string(left.size()) + " of the last attempt's " +
             std::to_string(last.size()) +
             " hosts are left, not a majority, and a lost node 0 "
             "looks the same from here as a network split in which node 0 goes on";
    return "";
  }

  std::string resume_hint() const {
    return std::string("To resume, start the job again on every host with the same command (") +
           (o_.dynamic_rank() ? "with --rdzv-endpoint naming a host that is up"
                              : "node 0 must run at --master-addr again") +
           "); a program that saves checkpoints continues from its latest one. This host's "
           "command: " +
           o_.command_line;
  }

  // Note [A new coordinator]: become it, or reach it; the next node rank after a while.
  void find_coordinator(double now) {
    if (candidate_ >= candidates_.size()) {
      exit_error(kExitLinkLost, "no host took over after node " +
                                    std::to_string(view_.coordinator) + " was lost. " +
                                    resume_hint());
      return;
    }
    JobView view = view_;
    for (size_t i = 0; i < candidate_; ++i) view.gone.push_back(candidates_[i]);
    const int c = candidates_[candidate_];
    if (c == o_.node_rank) {
      std::string error;
      auto successor = make_successor_coordinator(o_, view, lost_why_, error);
      if (!successor) {
        exit_error(kExitLinkLost, "node " + std::to_string(c) + " cannot take over: " + error +
                                      ". " + resume_hint());
        return;
      }
      return adopt(std::move(successor));
    }
    if (now < next_try_) return;
    std::string error;
    const std::string addr = view_.address(c);
    const int fd = connect_tcp(addr, o_.rdzv_port, 0.25, error);
    if (fd >= 0) {
      std::cerr << "ddprun: rejoining the job at node " << c << " (" << addr << ":" << o_.rdzv_port
                << ")\n";
      o_.master_addr = addr;  // the workers' rendezvous: group rank 0 runs there from now on
      view.coordinator = c;
      view.gone.push_back(view_.coordinator);
      return adopt(std::make_unique<AgentCoordinator>(o_, fd, now, &view));
    }
    next_try_ = now + 0.5;
    if (now < deadline_) return;
    std::cerr << "ddprun: node " << c << " at " << addr << " did not take over within "
              << seconds_text(o_.takeover_window()) << " (" << error << ")\n";
    ++candidate_;
    deadline_ = now + o_.takeover_window();
  }

  void adopt(std::unique_ptr<Coordinator> next) {
    failing_over_ = false;
    next_ = std::move(next);
    forward([&] {
      if (stopped_ == failover_attempt_) next_->local_stopped(stopped_);
    });
  }

  // Runs `f` on the next coordinator and passes its decisions on, but for the restart
  // that this host already began when the old coordinator was lost.
  template <typename F>
  void forward(F f) {
    f();
    Decision d;
    while (next_->next(d)) {
      if (!restart_seen_ && d.kind == Decision::Restart && d.attempt == failover_attempt_) {
        restart_seen_ = true;
        continue;
      }
      decide(std::move(d));
    }
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
  std::unique_ptr<Connection> conn_;
  double join_deadline_;
  double retry_until_;  // a connection closed before its handshake ended is tried again until then
  double reconnect_at_ = 0;  // when to try again (0: not waiting to)
  bool retry_told_ = false;
  std::string first_line_;  // hello or rejoin: said again on a new connection
  std::string where_;
  bool polled_ = false;
  bool started_ = false;
  bool exiting_ = false;
  JobView view_;  // what node 0 said of the job (MIN:MAX)
  // Note [A new coordinator]: the search after the coordinator was lost.
  bool failing_over_ = false;
  std::vector<int> candidates_;  // the members left, by node rank
  size_t candidate_ = 0;         // the one tried now
  double deadline_ = 0;          // when to give up on it
  double next_try_ = 0;
  int failover_attempt_ = -1;  // the attempt the restart begun then will run
  int stopped_ = -1;           // the attempt whose workers stopped meanwhile
  std::string lost_why_;
  bool restart_seen_ = false;
  std::unique_ptr<Coordinator> next_;  // the coordinator found: all goes through it
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
