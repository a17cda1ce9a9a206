// Node 0's side of the control channel: it gathers the other hosts, feeds
// their reports to the job policy with its own, and passes every decision on.
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <iostream>
#include <algorithm>
#include <map>
#include <set>

#include "control_channel.h"
#include "sysinfo.h"
#include "wire.h"

namespace ddprun {
namespace {

constexpr int kListener = INT_MIN;  // key of the listening socket in polled_

class Node0Coordinator : public DecidingCoordinator {
 public:
  // `self`: 0, or the node that takes over (take_over_from) after node 0 was lost.
  Node0Coordinator(const Options& o, const std::string& run_id, int listener, int self = 0)
      : DecidingCoordinator(o.nnodes, o.max_restarts, run_id, o.min_nodes, self),
        o_(o),
        listener_(listener),
        join_deadline_(now_seconds() + o.rdzv_timeout) {
    addrs_[self] = o.master_addr;
  }

  // Note [A new coordinator]: goes on with the members of `v` that rejoin in time.
  void take_over_from(const JobView& v, const std::string& why) {
    for (const auto& [node, addr] : v.peers) addrs_[node] = addr;
    addrs_[self()] = o_.master_addr;
    std::set<int> gone(v.gone.begin(), v.gone.end());
    gone.insert(v.coordinator);
    for (int n : v.members)
      if (!gone.count(n) && n != self()) awaited_.insert(n);
    rejoin_deadline_ = now_seconds() + o_.takeover_window();
    lost_coordinator_ = v.coordinator;
    std::cerr << "ddprun: node " << self() << " takes over as the coordinator at " << o_.master_addr
              << ":" << o_.rdzv_port << " (node " << v.coordinator << " was lost); a host that "
              << "joins later must give --rdzv-endpoint " << o_.master_addr << ":" << o_.rdzv_port
              << "\n";
    take_over(v.members, gone, v.coordinator, v.attempt, v.restarts, why);
    next_rank_ = policy().next_node();  // above every member of the last attempt
    if (awaited_.empty()) rejoin_deadline_ = 0;
  }

  ~Node0Coordinator() override {
    if (listener_ >= 0) ::close(listener_);
  }

  void add_poll_fds(std::vector<pollfd>& fds) override {
    polled_.clear();
    if (listener_ >= 0) {
      fds.push_back({listener_, POLLIN, 0});
      polled_.push_back(kListener);
    }
    for (auto& [key, conn] : conns_) {
      fds.push_back({conn->fd(), POLLIN, 0});
      polled_.push_back(key);
    }
  }

  void on_poll(const pollfd* fds, size_t count) override {
    for (size_t i = 0; i < count && i < polled_.size(); ++i) {
      if (!fds[i].revents) continue;
      if (polled_[i] == kListener) {
        accept_all();
        continue;
      }
      int key = polled_[i];
      auto it = conns_.find(key);
      if (it == conns_.end()) continue;
      std::vector<std::string> lines;
      bool open = it->second->read_lines(lines);
      for (size_t l = 0; l < lines.size() && key != 0; ++l) key = handle_line(key, lines[l]);
      if (!open && key != 0 && conns_.count(key)) broken(key);
    }
  }

  void tick(double now) override {
    drop_slow_strangers(now);
    if (now >= refusals_until_) show_hidden_refusals();
    if (rejoin_deadline_ > 0 && now >= rejoin_deadline_) {
      rejoin_deadline_ = 0;
      const std::set<int> late = awaited_;
      awaited_.clear();
      for (int node : late)
        handle(Event::node_lost(node, "it did not rejoin within " +
                                          seconds_text(o_.takeover_window()) + " after node " +
                                          std::to_string(lost_coordinator_) + " was lost"));
    }
    if (last_call_at_ > 0 && now >= last_call_at_) {
      last_call_at_ = 0;
      handle(Event::last_call_over());
    }
    if (!policy().started() && now > join_deadline_) {
      std::string missing;
      for (int n = 1; n < o_.nnodes; ++n)
        if (!conns_.count(n)) missing += (missing.empty() ? "" : ", ") + std::to_string(n);
      if (o_.dynamic_rank())
        missing = std::to_string(o_.min_nodes - policy().present()) + " more host(s)";
      handle(Event::join_timed_out(
          "nodes " + missing + " did not join within --rdzv-timeout " +
          std::to_string(static_cast<int>(o_.rdzv_timeout)) + " s. Node 0 waits at " +
          o_.master_addr + ":" + std::to_string(o_.rdzv_port) + "; " +
          (o_.dynamic_rank() ? "start the same ddprun command (--rdzv-endpoint, --nnodes, "
                               "--rdzv-id) on the other hosts."
                             : "start ddprun there with --nnodes " + std::to_string(o_.nnodes) +
                                   " --master-addr " + o_.master_addr + " --master-port " +
                                   std::to_string(o_.master_port) + " and their --node-rank.")));
      return;
    }
    std::vector<int> silent;
    for (auto& [key, conn] : conns_) {
      if (now - conn->last_sent >= o_.keep_alive_interval)
        conn->send_line(encode(Node0Message::ping()));
      if (now - conn->last_received > o_.peer_timeout()) silent.push_back(key);
    }
    for (int key : silent) lost(key, "stopped answering");
  }

  void shutdown(double timeout_s) override {
    show_hidden_refusals();
    double deadline = now_seconds() + timeout_s;
    for (auto& [key, conn] : conns_) conn->close_gracefully(deadline);
    conns_.clear();
  }

 private:
  // Connections not yet introduced get negative keys; joined ones use the node. At most
  // kMaxUnjoined of them at once: more, from a flood of connections, are closed at once
  // (an honest host whose connection is closed before its handshake tries again).
  void accept_all() {
    for (;;) {
      int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      size_t unjoined = 0;
      for (const auto& [key, conn] : conns_) unjoined += key < 0;
      if (unjoined >= kMaxUnjoined) {
        refusal("refused a connection from " + peer_endpoint(fd) + ": " + std::to_string(unjoined) +
                " connections are already waiting to " +
                (secret() ? "authenticate" : "say which host they are") + " (at most " +
                std::to_string(kMaxUnjoined) + ")");
        ::close(fd);
        continue;
      }
      conns_[next_pending_--] = std::make_unique<Connection>(fd, secret(), auth::Role::Coordinator);
    }
  }

  const auth::Bytes* secret() const { return o_.secret.empty() ? nullptr : &o_.secret; }

  // A connection that closed, or whose peer broke the protocol (a line too long, a failed
  // handshake, a line that failed its check): refused and logged with the peer's address.
  void broken(int key) {
    const Connection& conn = *conns_.at(key);
    if (conn.failure() == Connection::Failure::None) return lost(key, "closed the connection");
    const std::string who = key < 0 ? "a connection from " + conn.peer()
                                    : "node " + std::to_string(key) + " at " + conn.peer();
    const bool handshake = conn.failure() == Connection::Failure::Handshake;
    refusal("refused " + who + ": " + (handshake ? "authentication failed: " : "") +
            conn.failure_text() + "; closed the connection");
    if (conn.peer_is_plain())  // a host without the secret: it can read why
      conns_.at(key)->send_plain(encode(Node0Message::refuse(
          "node " + std::to_string(self()) +
          " authenticates the hosts of this job with a shared secret; give this host the "
          "same --rdzv-secret-file (docs/security.md)")));
    lost(key, conn.failure() == Connection::Failure::TooLong
                  ? "sent a line longer than the protocol allows"
                  : "sent a line that failed its authentication check");
  }

  // Connections that did not authenticate (or, without a secret, say which host they are)
  // within kHandshakeTimeout are closed: a stranger cannot hold descriptors for long.
  void drop_slow_strangers(double now) {
    std::vector<int> slow;
    for (const auto& [key, conn] : conns_)
      if (key < 0 && now - conn->opened > kHandshakeTimeout) slow.push_back(key);
    for (int key : slow) {
      refusal("closed a connection from " + conns_[key]->peer() + ": it did not " +
              (secret() ? "authenticate" : "say which host it is") + " within " +
              std::to_string(static_cast<int>(kHandshakeTimeout)) + " s");
      conns_.erase(key);
    }
  }

  // A refusal for the log, at most kShownRefusals per kRefusalWindow seconds so that a
  // flood cannot fill the disk; how many were left out is said when the window ends.
  void refusal(const std::string& text) {
    constexpr int kShownRefusals = 20;
    constexpr double kRefusalWindow = 10;
    const double now = now_seconds();
    if (now >= refusals_until_) {
      show_hidden_refusals();
      refusals_until_ = now + kRefusalWindow;
      refusals_shown_ = 0;
    }
    if (refusals_shown_ < kShownRefusals) {
      ++refusals_shown_;
      std::cerr << "ddprun: " << text << "\n";
    } else {
      ++refusals_hidden_;
    }
  }

  void show_hidden_refusals() {
    if (refusals_hidden_ > 0)
      std::cerr << "ddprun: " << refusals_hidden_
                << " more refusal(s) of connections not shown (at most 20 are shown per 10 s)\n";
    refusals_hidden_ = 0;
  }

  // Returns the connection's key afterwards (0 once it is dropped).
  int handle_line(int key, const std::string& line) {
    AgentMessage m = decode_agent_message(line);
    if (m.kind == AgentMessage::Ping) return key;
    if (key < 0 && m.kind == AgentMessage::Rejoining) return rejoin(key, m.rejoin);
    if (key < 0 && line.rfind("auth-hello ", 0) == 0) {  // Note [Signed lines]: we have no secret
      AgentMessage none;
      return hello(key, none,
                   "this host authenticates with --rdzv-secret-file but node " +
                       std::to_string(self()) +
                       " runs without one; give every host the same secret file, or none");
    }
    if (key < 0) return hello(key, m);
    if (m.kind == AgentMessage::Report) {
      m.event.node = key;
      handle(m.event);
    }
    return key;
  }

  int hello(int key, const AgentMessage& m, std::string problem = "") {
    auto conn = std::move(conns_[key]);
    conns_.erase(key);
    const Introduction& h = m.hello;
    if (!problem.empty()) {
      // the caller's
    } else if (m.kind != AgentMessage::Hello) {
      problem = "expected 'hello <node> <nnodes> <nproc>'";
    } else if (h.nnodes != o_.nnodes ||
               (h.min_nodes > 0 ? h.min_nodes : h.nnodes) != o_.min_nodes) {
      const auto range = [](int lo, int hi) {
        return lo > 0 && lo < hi ? std::to_string(lo) + ":" + std::to_string(hi)
                                 : std::to_string(hi);
      };
      problem = "node 0 has --nnodes " + range(o_.min_nodes, o_.nnodes) + " but this host has " +
                range(h.min_nodes, h.nnodes);
    } else if (h.nproc != o_.nproc_per_node) {
      problem = "node 0 runs --nproc-per-node " + std::to_string(o_.nproc_per_node) +
                " workers but this host wants " + std::to_string(h.nproc) +
                "; every host must run the same number";
    } else if (o_.dynamic_rank() && h.node != -1) {
      problem = "node 0 hands out node ranks (--rdzv-backend c10d) but this host has --node-rank " +
                std::to_string(h.node) + "; give every host the same --rdzv-backend";
    } else if (!o_.dynamic_rank() && h.node == -1) {
      problem = "this host asks for a node rank (--rdzv-backend c10d) but node 0 uses static "
                "ranks; give every host the same --rdzv-backend";
    } else if (o_.dynamic_rank() && h.run_id != (o_.run_id_given ? o_.run_id : "")) {
      problem = "this host has --rdzv-id '" + (h.run_id.empty() ? "(none)" : h.run_id) +
                "' but node 0 runs --rdzv-id '" + (o_.run_id_given ? o_.run_id : "(none)") +
                "'; every host of one job must give the same --rdzv-id";
    } else if (o_.dynamic_rank() &&
               (policy().present() >= o_.nnodes || (policy().started() && !policy().elastic()))) {
      problem = "all " + std::to_string(o_.nnodes) + " nodes (--nnodes) have already joined";
    } else if (h.node == -1) {
      // c10d: node ranks in join order; node 0 is the host serving the endpoint.
    } else if (h.node < 1 || h.node >= o_.nnodes) {
      problem = "--node-rank " + std::to_string(h.node) + " is not one of 1.." +
                std::to_string(o_.nnodes - 1);
    } else if (conns_.count(h.node) || policy().started()) {
      problem = "--node-rank " + std::to_string(h.node) +
                " has already joined; give each host its own --node-rank";
    }
    if (!problem.empty()) {
      std::cerr << "ddprun: refused a host: " << problem << "\n";
      conn->send_line(encode(Node0Message::refuse(problem)));
      conn->close_gracefully(now_seconds() + 1);
      return 0;
    }
    const int node = h.node == -1 ? next_rank_++ : h.node;
    if (h.node == -1) conn->send_line(encode(Node0Message::welcome(node)));
    addrs_[node] = peer_address(conn->fd());
    conns_[node] = std::move(conn);
    handle(Event::joined(node));
    return node;
  }

  // A member of the last attempt comes back after the coordinator it knew was lost; it
  // gets the restart under way (or the exit decided meanwhile).
  int rejoin(int key, const Rejoin& r) {
    auto conn = std::move(conns_[key]);
    conns_.erase(key);
    std::string problem;
    if (r.run_id != policy().run_id()) {
      problem = "this host ran job '" + r.run_id + "' but node " + std::to_string(self()) +
                " coordinates job '" + policy().run_id() + "'";
    } else if (!awaited_.count(r.node)) {
      problem = "node " + std::to_string(self()) + " does not wait for node " +
                std::to_string(r.node) + " to rejoin (it was not a member of attempt " +
                std::to_string(r.attempt) + ", or it came too late)";
    }
    if (!problem.empty()) {
      std::cerr << "ddprun: refused a host: " << problem << "\n";
      conn->send_line(encode(Node0Message::refuse(problem)));
      conn->close_gracefully(now_seconds() + 1);
      return 0;
    }
    awaited_.erase(r.node);
    if (awaited_.empty()) rejoin_deadline_ = 0;
    addrs_[r.node] = peer_address(conn->fd());
    std::cerr << "ddprun: node " << r.node << " rejoined\n";
    if (last_order_.kind != Decision::Wait)
      conn->send_line(encode(Node0Message::order(last_order_)));
    conns_[r.node] = std::move(conn);
    return r.node;
  }

  // Every decision reaches the other hosts before this host's supervisor acts on it.
  void announce(const Decision& d) override {
    last_order_ = d;
    if (d.kind == Decision::LastCall) {
      last_call_at_ = now_seconds() + o_.last_call_timeout;
      std::cerr << "ddprun: " << o_.min_nodes << " node(s) joined (--nnodes " << o_.min_nodes << ":"
                << o_.nnodes << "); starting in " << o_.last_call_timeout
                << " s (last_call_timeout) unless all " << o_.nnodes << " join sooner\n";
      return;
    }
    if (d.kind == Decision::Start && listener_ >= 0 && !policy().elastic()) start_job();
    if (d.kind == Decision::Start && policy().elastic())
      std::cerr << "ddprun: starting attempt " << d.attempt << " on " << d.members.size()
                << " node(s)\n";
    // With MIN:MAX, hosts waiting to join take no part in a restart; they are started
    // with the next attempt's members.
    const std::string line = encode(Node0Message::order(d));
    // MIN:MAX: the members' addresses for a new coordinator, if need be (Note [A new
    // coordinator]); before a restart, those left, so that the others know who was lost.
    std::string peers;
    if ((d.kind == Decision::Start || d.kind == Decision::Restart) && policy().elastic()) {
      Peers list;
      for (const auto& [n, addr] : addrs_)
        if (policy().member(n)) list.emplace_back(n, addr);
      peers = encode(Node0Message::peer_list(list));
    }
    for (auto& [key, conn] : conns_) {
      if (key < 0 || key == self() || !(d.kind == Decision::Exit || policy().member(key))) continue;
      if (!peers.empty()) conn->send_line(peers);
      conn->send_line(line);
    }
  }

  // The first start: every node has joined, so no other host is let in.
  void start_job() {
    ::close(listener_);
    listener_ = -1;
    for (auto it = conns_.begin(); it != conns_.end();)  // never introduced themselves
      it = it->first < 0 ? conns_.erase(it) : std::next(it);
    std::cerr << "ddprun: all " << o_.nnodes << " nodes joined; starting the workers\n";
  }

  void lost(int key, const std::string& how) {
    auto it = conns_.find(key);
    if (it != conns_.end() && key >= 0) {
      // A host that was only slow (stopped, swapped out) reads this before it could
      // take the silence for node 0's loss: it stops instead of taking over.
      Decision drop;
      drop.kind = Decision::Exit;
      drop.code = kExitLinkLost;
      drop.node = key;
      drop.why = "node " + std::to_string(self()) + " heard nothing from this host for " +
                 seconds_text(o_.peer_timeout()) + " and goes on without it";
      it->second->send_line(encode(Node0Message::order(drop)));
    }
    conns_.erase(key);
    if (key < 0) return;
    handle(Event::node_lost(key,
                            "its ddprun " + how + " (host down, ddprun killed, or network lost)"));
  }

  const Options& o_;
  int listener_;
  double join_deadline_;
  std::map<int, std::unique_ptr<Connection>> conns_;
  std::vector<int> polled_;
  int next_pending_ = -1;
  int next_rank_ = 1;                 // c10d: the node rank the next host to join gets
  double last_call_at_ = 0;           // MIN:MAX: when the last call ends (0: none running)
  std::map<int, std::string> addrs_;  // each node's ddprun address, as seen here
  Decision last_order_;               // the last decision announced
  // After taking over: the members still to rejoin, until when, and whom they lost.
  std::set<int> awaited_;
  double rejoin_deadline_ = 0;
  int lost_coordinator_ = -1;
  // refusal(): the log's current window, and what was shown and left out in it.
  double refusals_until_ = 0;
  int refusals_shown_ = 0;
  int refusals_hidden_ = 0;
};

}  // namespace

namespace {

std::unique_ptr<Coordinator> node0_on(const Options& o, const std::string& run_id, int fd) {
  std::cerr << "ddprun: node 0 waiting for " << o.nnodes - 1 << " more node(s)"
            << (o.min_nodes < o.nnodes ? " (at least " + std::to_string(o.min_nodes - 1) + ")" : "")
            << " at " << o.master_addr << ":" << o.rdzv_port << "\n";
  auto coordinator = std::make_unique<Node0Coordinator>(o, run_id, fd);
  coordinator->handle(Event::joined(0));  // the job starts once the others have joined too
  return coordinator;
}

// The rendezvous socket a program that started ddprun handed over, -1 when none was
// (kHandedBad, with the error printed, when one was but is unusable).
constexpr int kHandedBad = -2;
int handed_over(const Options& o) {
  const char* handed = std::getenv("DDPRUN_RDZV_LISTEN_FD");
  if (!handed) return -1;
  std::string error;
  const int fd = handed_listener(handed, o.rdzv_port, error);
  if (fd >= 0) {
    unsetenv("DDPRUN_RDZV_LISTEN_FD");  // the workers inherit neither the socket nor the variable
    return fd;
  }
  std::cerr << "ddprun: error: DDPRUN_RDZV_LISTEN_FD=" << handed << ": " << error
            << ". Hand over a socket that listens on the rendezvous port, or unset it.\n";
  return kHandedBad;
}

}  // namespace

std::unique_ptr<Coordinator> make_node0_coordinator(const Options& o, const std::string& run_id,
                                                    int& exit_code) {
  std::string error;
  // A program that starts ddprun may bind and listen on the rendezvous port itself and
  // hand the socket over, inherited across exec, so that the port is never free between
  // being chosen and being served (tests started at once, socket activation).
  int fd = handed_over(o);
  if (fd == kHandedBad) {
    exit_code = kExitUsage;
    return nullptr;
  }
  if (fd < 0) fd = listen_tcp(o.master_addr, o.rdzv_port, error);
  if (fd < 0) {
    std::cerr << "ddprun: error: node 0 cannot listen on " << o.master_addr << ":" << o.rdzv_port
              << " for the other hosts: " << error << ". --master-addr must be an address of "
              << "this host, and the port (--rdzv-port, default master port + 1) must be free.\n";
    exit_code = kExitUsage;
    return nullptr;
  }
  return node0_on(o, run_id, fd);
}

std::unique_ptr<Coordinator> make_successor_coordinator(Options& o, const JobView& view,
                                                        const std::string& why,
                                                        std::string& error) {
  const std::string addr = view.address(o.node_rank);
  if (addr.empty()) {
    error = "node 0 never told this host its own address";
    return nullptr;
  }
  const int fd = listen_tcp(addr, o.rdzv_port, error);
  if (fd < 0) {
    error = "cannot listen on " + addr + ":" + std::to_string(o.rdzv_port) + ": " + error;
    return nullptr;
  }
  o.master_addr = addr;  // the workers' rendezvous: group rank 0 runs here from now on
  auto coordinator = std::make_unique<Node0Coordinator>(o, view.run_id, fd, o.node_rank);
  coordinator->take_over_from(view, why);
  return coordinator;
}

std::unique_ptr<Coordinator> make_c10d_coordinator(Options& o, const std::string& run_id,
                                                   int& exit_code) {
  // As torchrun's c10d rendezvous: the host that can serve the endpoint (it was handed
  // the socket, or the address is its own and the port is free) is node 0; every other
  // host joins it. A port already served there means another host got it first.
  int fd = handed_over(o);
  if (fd == kHandedBad) {
    exit_code = kExitUsage;
    return nullptr;
  }
  std::string error;
  if (fd < 0) fd = listen_tcp(o.master_addr, o.rdzv_port, error);
  if (fd >= 0) {
    o.node_rank = 0;
    return node0_on(o, run_id, fd);
  }
  o.node_rank = -1;
  return make_agent_coordinator(o, exit_code);
}

}  // namespace ddprun
