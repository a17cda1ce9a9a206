// Command-line options of ddprun, checked before anything is spawned.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "exit_codes.h"

namespace ddprun {

struct Options {
  std::string nproc_spec = "1";
  int nproc_per_node = 1;  // resolved from nproc_spec
  int nnodes = 1;          // with MIN:MAX, MAX
  int min_nodes = 1;       // --nnodes MIN:MAX (c10d only); MIN == nnodes for a fixed number
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port on one host, 29500 on several
  int rdzv_port = 0;    // 0: master_port + 1
  double rdzv_timeout = 300;
  int max_restarts = 0;
  double monitor_interval = 0.1;
  std::string log_dir;
  int redirect = 0;  // bit 0: stdout, bit 1: stderr (torchrun's 1/2/3)
  int tee = 0;
  bool standalone = false;
  double grace_period = 5;
  bool no_prefix = false;
  std::string run_id;         // empty: random (node 0's on several hosts)
  bool run_id_given = false;  // --run-id/--rdzv-id was given (c10d hosts must agree on it)
  // Rendezvous: "static" (node ranks from --node-rank) or "c10d" (node ranks in join
  // order; node 0 is the host that can listen on --rdzv-endpoint).
  std::string rdzv_backend = "static";
  double last_call_timeout = 30;  // --rdzv-conf; for MIN:MAX membership
  double close_timeout = 30;      // --rdzv-conf
  // --rdzv-conf keep_alive_interval and keep_alive_max_attempt (torchrun's keys): every
  // ddprun pings its peers each interval, and a peer silent for interval * max_attempt
  // seconds (peer_timeout) is lost. Every host of a job must be given the same values.
  double keep_alive_interval = 2;
  int keep_alive_max_attempt = 15;
  double peer_timeout() const { return keep_alive_interval * keep_alive_max_attempt; }
  // After the coordinator is lost: how long the others wait for the next one to listen,
  // and how long a new coordinator waits for the others to rejoin. Longer than
  // peer_timeout(), since a host may see the loss that much later than another.
  double takeover_window() const { return peer_timeout() + 10; }
  std::string role = "default";         // ROLE_NAME
  std::vector<int> local_ranks_filter;  // local ranks shown on the console; empty: all
  std::vector<std::string> command;
  std::string program_path;  // command[0] as execvp would find it
  std::string command_line;  // ddprun's own command line, quoted as a shell reads it
  // --rdzv-secret-file (or $DDPRUN_SECRET_FILE): the job secret's file, "" for none; main()
  // loads it into `secret` (auth.h), which authenticates the control channel.
  std::string secret_file;
  std::vector<unsigned char> secret;

  bool multi_host() const { return nnodes > 1; }
  // Node ranks are handed out at rendezvous (node_rank is -1 until then on nodes 1..N-1).
  bool dynamic_rank() const { return multi_host() && rdzv_backend == "c10d"; }
  bool shows_local_rank(int local_rank) const;
  int world_size() const { return nnodes * nproc_per_node; }
};

// Parses and checks argv. On --help or on an error, prints what is needed and
// returns nullopt with exit_code set (0 for --help, 2 for usage errors,
// 126/127 for a program that cannot be run).
std::optional<Options> parse_options(int argc, char** argv, int& exit_code);

// "30 s", "1.5 s": a number of seconds for messages.
std::string seconds_text(double seconds);

}  // namespace ddprun
