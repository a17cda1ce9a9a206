// Node 0's side of the control channel: it gathers the other hosts, then makes
// every start/restart/stop decision for the whole job.
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>

#include "control_channel.h"
#include "sysinfo.h"

namespace ddprun {
namespace {

constexpr int kListener = INT_MIN;  // key of the listening socket in polled_

class Node0Coordinator : public Coordinator {
 public:
  Node0Coordinator(const Options& o, std::string run_id, int listener)
      : o_(o), run_id_(std::move(run_id)), listener_(listener),
        join_deadline_(now_seconds() + o.rdzv_timeout) {}

  ~Node0Coordinator() override {
    if (listener_ >= 0) ::close(listener_);
  }

  void local_failed(int attempt, int code, const std::string& what) override {
    on_failed(0, attempt, code, what);
  }
  void local_finished(int attempt) override { on_finished(0, attempt); }
  void local_stopped(int attempt) override { on_stopped(0, attempt); }
  void local_abort(int code, const std::string& what) override { stop_all(code, 0, what); }

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
      for (size_t l = 0; l < lines.size() && key != 0; ++l) key = handle(key, lines[l]);
      if (!open && key != 0 && conns_.count(key)) lost(key, "closed the connection");
    }
  }

  void tick(double now) override {
    if (!joined_ && now > join_deadline_) {
      std::string missing;
      for (int n = 1; n < o_.nnodes; ++n)
        if (!conns_.count(n)) missing += (missing.empty() ? "" : ", ") + std::to_string(n);
      Decision d;
      d.code = kExitLinkLost;
      d.error = "nodes " + missing + " did not join within --rdzv-timeout " +
                std::to_string(static_cast<int>(o_.rdzv_timeout)) + " s. Node 0 waits at " +
                o_.master_addr + ":" + std::to_string(o_.rdzv_port) + "; start ddprun there with " +
                "--nnodes " + std::to_string(o_.nnodes) + " --master-addr " + o_.master_addr +
                " --master-port " + std::to_string(o_.master_port) + " and their --node-rank.";
      stop_all_with(d);
      return;
    }
    std::vector<int> silent;
    for (auto& [key, conn] : conns_) {
      if (now - conn->last_sent >= kPingInterval) conn->send_line("ping");
      if (now - conn->last_received > kPeerTimeout) silent.push_back(key);
    }
    for (int key : silent) lost(key, "stopped answering");
  }

  void shutdown(double timeout_s) override {
    double deadline = now_seconds() + timeout_s;
    for (auto& [key, conn] : conns_) conn->close_gracefully(deadline);
    conns_.clear();
  }

 private:
  // Connections not yet introduced get negative keys; joined ones use the node.
  void accept_all() {
    for (;;) {
      int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      conns_[next_pending_--] = std::make_unique<Connection>(fd);
    }
  }

  // Returns the connection's key afterwards (0 once it is dropped).
  int handle(int key, const std::string& line) {
    auto w = split_words(line, 4);
    if (w.empty() || w[0] == "ping") return key;
    if (key < 0) return hello(key, w);
    if (w[0] == "fail" && w.size() >= 3) {
      on_failed(key, number(w[1]), number(w[2]), w.size() > 3 ? w[3] : "failed");
    } else if (w[0] == "finished" && w.size() >= 2) {
      on_finished(key, number(w[1]));
    } else if (w[0] == "stopped" && w.size() >= 2) {
      on_stopped(key, number(w[1]));
    } else if (w[0] == "abort" && w.size() >= 2) {
      auto a = split_words(line, 3);
      stop_all(number(a[1]), key, a.size() > 2 ? a[2] : "stopped");
    }
    return key;
  }

  static int number(const std::string& s) { return std::atoi(s.c_str()); }

  int joined_count() const {
    int n = 0;
    for (auto& [key, conn] : conns_) n += key > 0;
    return n;
  }

  int hello(int key, const std::vector<std::string>& w) {
    auto conn = std::move(conns_[key]);
    conns_.erase(key);
    std::string problem;
    int node = -1;
    if (w.size() != 4 || w[0] != "hello") {
      problem = "expected 'hello <node> <nnodes> <nproc>'";
    } else {
      node = number(w[1]);
      int nnodes = number(w[2]), nproc = number(w[3]);
      if (nnodes != o_.nnodes)
        problem = "node 0 has --nnodes " + std::to_string(o_.nnodes) + " but this host has " + w[2];
      else if (nproc != o_.nproc_per_node)
        problem = "node 0 runs --nproc-per-node " + std::to_string(o_.nproc_per_node) +
                  " workers but this host wants " + w[3] + "; every host must run the same number";
      else if (node < 1 || node >= o_.nnodes)
        problem = "--node-rank " + w[1] + " is not one of 1.." + std::to_string(o_.nnodes - 1);
      else if (conns_.count(node) || joined_)
        problem = "--node-rank " + w[1] + " has already joined; give each host its own --node-rank";
    }
    if (!problem.empty()) {
      std::cerr << "ddprun: refused a host: " << problem << "\n";
      conn->send_line("error " + problem);
      conn->close_gracefully(now_seconds() + 1);
      return 0;
    }
    conns_[node] = std::move(conn);
    if (joined_count() == o_.nnodes - 1) start_job();
    return node;
  }

  void start_job() {
    joined_ = true;
    ::close(listener_);
    listener_ = -1;
    for (auto it = conns_.begin(); it != conns_.end();)  // never introduced themselves
      it = it->first < 0 ? conns_.erase(it) : std::next(it);
    std::cerr << "ddprun: all " << o_.nnodes << " nodes joined; starting the workers\n";
    go(0);
  }

  void go(int attempt) {
    attempt_ = attempt;
    decided_ = false;
    finished_.clear();
    broadcast("go " + std::to_string(attempt) + " " + run_id_);
    Decision d;
    d.kind = Decision::Start;
    d.attempt = attempt;
    d.run_id = run_id_;
    decide(d);
  }

  void on_failed(int node, int attempt, int code, const std::string& what) {
    if (stopping_ || attempt != attempt_ || decided_) return;
    decided_ = true;
    if (attempt < o_.max_restarts) {
      restart_to_ = attempt + 1;
      stopped_.clear();
      broadcast("restart " + std::to_string(restart_to_) + " " + std::to_string(node) + " " + what);
      Decision d;
      d.kind = Decision::Restart;
      d.attempt = restart_to_;
      d.node = node;
      d.why = what;
      decide(d);
    } else {
      stop_all(code, node, what);
    }
  }

  void on_finished(int node, int attempt) {
    if (stopping_ || attempt != attempt_ || decided_) return;
    finished_.insert(node);
    if (static_cast<int>(finished_.size()) < o_.nnodes) return;
    stopping_ = true;
    broadcast("done");
    decide(Decision{});
  }

  void on_stopped(int node, int attempt) {
    if (stopping_ || attempt != restart_to_) return;
    stopped_.insert(node);
    if (static_cast<int>(stopped_.size()) == o_.nnodes) go(attempt);
  }

  void lost(int key, const std::string& how) {
    conns_.erase(key);
    if (key < 0 || stopping_) return;
    stop_all(kExitLinkLost, key, "its ddprun " + how + " (host down, ddprun killed, or network lost)");
  }

  void stop_all(int code, int node, const std::string& what) {
    Decision d;
    d.code = code;
    d.node = node;
    d.why = what;
    stop_all_with(d);
  }

  void stop_all_with(const Decision& d) {
    if (stopping_) return;
    stopping_ = true;
    broadcast("abort " + std::to_string(d.code) + " " + std::to_string(d.node) + " " + d.why);
    decide(d);
  }

  void broadcast(const std::string& line) {
    for (auto& [key, conn] : conns_)
      if (key > 0) conn->send_line(line);
  }

  const Options& o_;
  std::string run_id_;
  int listener_;
  double join_deadline_;
  std::map<int, std::unique_ptr<Connection>> conns_;
  std::vector<int> polled_;
  int next_pending_ = -1;
  bool joined_ = false;
  bool stopping_ = false;
  bool decided_ = false;
  int attempt_ = -1;
  int restart_to_ = -1;
  std::set<int> finished_, stopped_;
};

}  // namespace

std::unique_ptr<Coordinator> make_node0_coordinator(const Options& o, const std::string& run_id,
                                                    int& exit_code) {
  std::string error;
  int fd = listen_tcp(o.master_addr, o.rdzv_port, error);
  if (fd < 0) {
    std::cerr << "ddprun: error: node 0 cannot listen on " << o.master_addr << ":" << o.rdzv_port
              << " for the other hosts: " << error << ". --master-addr must be an address of "
              << "this host, and the port (--rdzv-port, default master port + 1) must be free.\n";
    exit_code = kExitUsage;
    return nullptr;
  }
  std::cerr << "ddprun: node 0 waiting for " << o.nnodes - 1 << " more node(s) at " << o.master_addr
            << ":" << o.rdzv_port << "\n";
  return std::make_unique<Node0Coordinator>(o, run_id, fd);
}

}  // namespace ddprun
