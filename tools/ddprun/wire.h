// The messages of the control channel between node 0 and the other hosts'
// ddprun (the agents; see control_channel.h), and the only code that writes or
// reads them. One text line per message:
//
//   agent -> node 0: hello <node> <nnodes> <nproc> [<rdzv-id>]  (<node> -1: hand me one;
//                                                    <nnodes> MIN:MAX for a range)
//                    fail <attempt> <code> <what>     (its workers failed)
//                    finished <attempt>               (its workers all exited 0)
//                    stopped <attempt>                (its workers are gone, ready to restart)
//                    abort <code> <what>              (it stops for good, e.g. SIGINT)
//                    rejoin <node> <attempt> <run-id> (to a new coordinator after node 0
//                                                      was lost; see coordinator_agent.cpp)
//   node 0 -> agent: welcome <node>                   (joined; c10d: its node rank)
//                    go <attempt> <restarts> <run-id> [<n>,<n>...] (start the workers;
//                                                      with --nnodes MIN:MAX, the members by
//                                                      group rank)
//                    peers <n>=<addr>,<n>=<addr>...  (MIN:MAX, before each go or restart:
//                                                      the members' addresses, for a new
//                                                      coordinator; those left before a restart)
//                    restart <attempt> <node> <what>  (stop them; wait for the next go)
//                    done                             (every host succeeded: exit 0)
//                    abort <code> <node> <what>       (stop them and exit with <code>)
//                    error <text>                     (this host is refused)
//   both ways:       ping                             (heartbeat; an empty line counts as one)
//
// Numbers are decimal integers and <run-id> one word (--run-id has no spaces);
// <what> and <text> take the rest of the line. A line that does not read as
// one of these is Invalid. What an agent reports are the events of the job
// policy, and what node 0 sends back its decisions (job_policy.h).
// With --rdzv-secret-file these lines travel signed, after a handshake (Note [Signed
// lines] in auth.h); the codec here neither knows nor cares.
#pragma once

#include <string>
#include <vector>

#include "job_policy.h"

namespace ddprun {

// What an agent says of itself when it joins; node 0 checks it against its own options.
struct Introduction {
  int node = 0;  // -1: c10d rendezvous, node 0 hands out the node rank
  int nnodes = 0;
  int nproc = 0;       // --nproc-per-node
  std::string run_id;  // --rdzv-id/--run-id when given, else empty
  int min_nodes = 0;   // --nnodes MIN:MAX; 0 (or nnodes): a fixed number
};

// A host that ran `attempt` of job `run_id` as node `node`, and asks the new
// coordinator to take it back after the old one was lost.
struct Rejoin {
  int node = 0;
  int attempt = 0;
  std::string run_id;
};

// Where each member's ddprun can be reached: (node, address), by node rank.
using Peers = std::vector<std::pair<int, std::string>>;

// A message from an agent to node 0.
struct AgentMessage {
  enum Kind { Invalid, Ping, Hello, Report, Rejoining } kind = Invalid;
  Introduction hello;  // Hello
  Rejoin rejoin;       // Rejoining
  // Report: a WorkerFailed, WorkersFinished, WorkersStopped or Aborted event.
  // Its node is not sent: node 0 knows the connection it came from.
  Event event;

  static AgentMessage ping();
  static AgentMessage introduce(const Introduction& hello);
  static AgentMessage report(const Event& e);
  static AgentMessage rejoining(const Rejoin& r);
};

// A message from node 0 to an agent.
struct Node0Message {
  enum Kind { Invalid, Ping, Welcome, Order, Refusal, PeerList } kind = Invalid;
  int node = -1;  // Welcome: the node rank of the host that joined
  // Order: a Start, Restart or Exit decision. An Exit with code 0 is sent as
  // `done`, without node or why.
  Decision decision;
  std::string refusal;  // Refusal: why this host may not join
  Peers peers;          // PeerList (addresses without spaces, commas or '=')

  static Node0Message ping();
  static Node0Message welcome(int node);
  static Node0Message order(const Decision& d);
  static Node0Message refuse(const std::string& problem);
  static Node0Message peer_list(const Peers& peers);
};

// The line for `m` (without the newline); empty for an Invalid message, or an
// event or decision that is never sent (e.g. Wait).
std::string encode(const AgentMessage& m);
std::string encode(const Node0Message& m);

AgentMessage decode_agent_message(const std::string& line);
Node0Message decode_node0_message(const std::string& line);

// Splits at spaces into at most `max_words` words; the last one takes the rest
// of the line, so free text can end a message.
std::vector<std::string> split_words(const std::string& line, size_t max_words);

}  // namespace ddprun
