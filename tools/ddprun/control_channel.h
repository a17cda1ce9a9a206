// The control channel between the ddprun agents of a multi-host job.
//
// Node 0's ddprun listens on --master-addr:--rdzv-port; every other ddprun
// connects, says which node it is, and waits for node 0 to start the job. The
// protocol is one text line per message:
//   agent -> node 0: hello <node> <nnodes> <nproc>
//                    fail <attempt> <code> <what>    (its workers failed)
//                    finished <attempt>              (its workers all exited 0)
//                    stopped <attempt>               (its workers are gone, ready to restart)
//                    abort <code> <what>             (it was told to stop, e.g. SIGINT)
//   node 0 -> agent: go <attempt> <run-id> | restart <attempt> <node> <what> | done
//                    abort <code> <node> <what> | error <text>
//   both ways:       ping                            (heartbeat)
// A connection that closes or stays silent too long counts as a failure of the
// host on the other end, so no host's workers outlive the job.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "coordinator.h"
#include "options.h"

namespace ddprun {

constexpr double kPingInterval = 2.0;
constexpr double kPeerTimeout = 30.0;
constexpr size_t kMaxMessage = 4096;

// One TCP connection carrying text lines.
class Connection {
 public:
  explicit Connection(int fd);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int fd() const { return fd_; }
  bool is_open() const { return fd_ >= 0; }
  bool send_line(const std::string& line);
  // Appends the whole lines received so far; false once the peer is gone.
  bool read_lines(std::vector<std::string>& lines);
  // Sends end-of-stream and waits (up to `deadline`, monotonic) for the peer's,
  // so that closing does not reset the connection under unread messages.
  void close_gracefully(double deadline);
  void close();

  double last_received;
  double last_sent;

 private:
  int fd_;
  std::string buffer_;
};

// A listening socket on addr:port, or -1 with `error` set.
int listen_tcp(const std::string& addr, int port, std::string& error);
// One connection attempt bounded by `timeout_s`; -1 with `error` set.
int connect_tcp(const std::string& addr, int port, double timeout_s, std::string& error);

std::vector<std::string> split_words(const std::string& line, size_t max_words);

// Node 0: listens now; the job starts once every other node has joined.
std::unique_ptr<Coordinator> make_node0_coordinator(const Options& o, const std::string& run_id,
                                                    int& exit_code);
// Other nodes: connects to node 0 (retrying until --rdzv-timeout) and joins.
std::unique_ptr<Coordinator> make_agent_coordinator(const Options& o, int& exit_code);

}  // namespace ddprun
