// The control channel between the ddprun agents of a multi-host job.
//
// Node 0's ddprun listens on --master-addr:--rdzv-port; every other ddprun
// connects, says which node it is, and waits for node 0 to start the job. The
// agents report what their workers do, and node 0 sends back what the job
// policy decides; wire.h defines these messages, one text line each.
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
// The listening socket handed over as descriptor number `fd_text`, checked to listen on
// `port` and made close-on-exec and non-blocking; -1 with `error` set.
int handed_listener(const std::string& fd_text, int port, std::string& error);
// One connection attempt bounded by `timeout_s`; -1 with `error` set.
int connect_tcp(const std::string& addr, int port, double timeout_s, std::string& error);

// Node 0: listens now; the job starts once every other node has joined.
std::unique_ptr<Coordinator> make_node0_coordinator(const Options& o, const std::string& run_id,
                                                    int& exit_code);
// Other nodes: connects to node 0 (retrying until --rdzv-timeout) and joins.
// (With c10d, o.node_rank is -1 here and set when node 0 hands it out.)
std::unique_ptr<Coordinator> make_agent_coordinator(Options& o, int& exit_code);
// --rdzv-backend c10d: node 0 if this host can serve --rdzv-endpoint, else an agent
// that node 0 gives the next node rank; sets o.node_rank accordingly.
std::unique_ptr<Coordinator> make_c10d_coordinator(Options& o, const std::string& run_id,
                                                   int& exit_code);

}  // namespace ddprun
