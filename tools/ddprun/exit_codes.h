// Exit codes shared by every part of ddprun (README.md lists them for users).
#pragma once

namespace ddprun {

constexpr int kExitError = 1;     // ddprun itself cannot go on (no free port, no temporary folder)
constexpr int kExitLinkLost = 1;  // a host was lost, or the hosts did not all join in time
constexpr int kExitUsage = 2;     // bad options, or node 0 refused this host
constexpr int kExitNotExecutable = 126;
constexpr int kExitNotFound = 127;

// The code of a process ended by signal `sig`, as a shell reports it (130 for
// SIGINT); also ddprun's own code when a stop signal ends the job.
constexpr int exit_code_for_signal(int sig) { return 128 + sig; }

}  // namespace ddprun
