// The control channel between the ddprun agents of a multi-host job.
//
// Node 0's ddprun listens on --master-addr:--rdzv-port; every other ddprun
// connects, says which node it is, and waits for node 0 to start the job. The
// agents report what their workers do, and node 0 sends back what the job
// policy decides; wire.h defines these messages, one text line each.
// A connection that closes or stays silent too long counts as a failure of the
// host on the other end, so no host's workers outlive the job.
//
// With --rdzv-secret-file every connection is authenticated (auth.h, Note [Signed
// lines]): a handshake first, then every line signed; one that fails its check closes
// the connection. Without it the lines are plain text, as before. Either way a peer that
// has not joined yet is held to little: lines of at most kMaxMessage bytes, kHandshakeTimeout
// seconds to authenticate (or, without a secret, to introduce itself), and at most
// kMaxUnjoined such connections at once on the coordinator.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "auth.h"
#include "coordinator.h"
#include "options.h"
#include "wire.h"

namespace ddprun {

// The pings' interval and the time after which a silent peer is lost are the job's
// (Options::keep_alive_interval, Options::peer_timeout and Options::takeover_window).
constexpr size_t kMaxMessage = 4096;
// A connection not yet joined: how long it may take to authenticate (or to say hello),
// and how many may be under way at once on the coordinator (more are closed at once).
constexpr double kHandshakeTimeout = 5.0;
constexpr size_t kMaxUnjoined = 32;

// One TCP connection carrying text lines; with the job's secret, authenticated.
class Connection {
 public:
  // `secret`: the job's secret (--rdzv-secret-file), or nullptr for plain lines. `role`:
  // this end's; the coordinator is the end that accepted the connection. With a secret
  // the handshake starts at once; lines sent before it ends wait for it.
  explicit Connection(int fd, const auth::Bytes* secret = nullptr,
                      auth::Role role = auth::Role::Agent);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int fd() const { return fd_; }
  bool is_open() const { return fd_ >= 0; }
  bool send_line(const std::string& line);
  // Appends the whole lines received so far (with a secret, those that passed their
  // checks); false once the peer is gone, or broke the protocol (then failure() says how,
  // and nothing more is read).
  bool read_lines(std::vector<std::string>& lines);
  // Sends end-of-stream and waits (up to `deadline`, monotonic) for the peer's,
  // so that closing does not reset the connection under unread messages.
  void close_gracefully(double deadline);
  void close();

  // Why read_lines() gave up on the peer (None: it closed the connection, or all is well).
  enum class Failure { None, TooLong, Handshake, Line };
  Failure failure() const { return failure_; }
  const std::string& failure_text() const { return failure_text_; }
  // With a secret: the handshake is done. Without: always.
  bool authenticated() const { return !handshake_ || channel_.has_value(); }
  // The handshake failed because the peer spoke the plain protocol (no secret there).
  bool peer_is_plain() const { return handshake_ && handshake_->peer_is_plain(); }
  // A plain line, outside the signed ones: what a peer without the secret can read.
  bool send_plain(const std::string& line) { return write_line(line); }
  // The other end, "ADDR:PORT" ("?" if unknown).
  const std::string& peer() const { return peer_; }

  double opened;  // when this end got the connection
  double last_received;
  double last_sent;

 private:
  bool write_line(const std::string& line);
  bool take(const std::string& line, std::vector<std::string>& lines);
  void fail(Failure how, const std::string& why);

  int fd_;
  std::string buffer_;
  std::string peer_;
  std::optional<auth::Handshake> handshake_;  // with a secret
  std::optional<auth::Channel> channel_;      // once the handshake is done
  std::vector<std::string> waiting_;          // sent before the handshake ended
  Failure failure_ = Failure::None;
  std::string failure_text_;
};

// The numeric address of the other end of connected socket `fd` ("" if unknown).
std::string peer_address(int fd);
// The same with its port: "ADDR:PORT", "[ADDR]:PORT" for IPv6 ("?" if unknown).
std::string peer_endpoint(int fd);

// What a host of a MIN:MAX job knows of it, enough to go on when the coordinator is
// lost (Note [A new coordinator]).
struct JobView {
  std::string run_id;
  int attempt = -1;          // the attempt started last (-1: none yet)
  int restarts = 0;          // restarts used so far
  std::vector<int> members;  // that attempt's nodes, by group rank
  Peers peers;               // their ddprun's addresses
  int coordinator = 0;       // the node that decides
  std::vector<int> gone;     // members known lost since that attempt started

  std::string address(int node) const;  // "" if not known
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
// This host goes on as the coordinator of `view`'s job after `view.coordinator` was lost:
// listens on its own address (view.peers) at --rdzv-port and waits for the others to
// rejoin. Sets o.master_addr to that address; nullptr with `error` set if it cannot listen.
std::unique_ptr<Coordinator> make_successor_coordinator(Options& o, const JobView& view,
                                                        const std::string& why, std::string& error);

}  // namespace ddprun
