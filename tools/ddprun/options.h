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
  int nnodes = 1;
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
  std::string run_id;  // empty: random (node 0's on several hosts)
  std::vector<std::string> command;
  std::string program_path;  // command[0] as execvp would find it

  bool multi_host() const { return nnodes > 1; }
  int world_size() const { return nnodes * nproc_per_node; }
};

// Parses and checks argv. On --help or on an error, prints what is needed and
// returns nullopt with exit_code set (0 for --help, 2 for usage errors,
// 126/127 for a program that cannot be run).
std::optional<Options> parse_options(int argc, char** argv, int& exit_code);

}  // namespace ddprun
