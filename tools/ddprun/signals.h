// Signals reach ddprun's poll loop through a self-pipe, so handlers do no work.
#pragma once

#include <vector>

namespace ddprun {

// Catches SIGINT, SIGTERM, SIGHUP and SIGCHLD, and ignores SIGPIPE (a closed
// console must not kill ddprun while workers run). Call once, before any fork.
void install_signal_pipe();

// Read end of the pipe, for poll().
int signal_pipe_fd();

// Signals caught since the last call, in order (SIGCHLD included).
std::vector<int> take_signals();

}  // namespace ddprun
