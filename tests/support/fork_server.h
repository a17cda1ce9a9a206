#pragma once
// Note [Rank processes from a fork server]
// A rank process of run_processes used to be this test binary executed again: each paid
// LibTorch's start-up (loading and relocating its libraries, registering its kernels:
// about 0.45 s of a core here) before its scenario's first line, some 150 times in a
// full run. The fork server is a copy of the test process made at the top of main(),
// when it has loaded everything and run nothing, and still has one thread; it forks the
// rank processes. A child gets the environment, working folder and inherited file
// descriptors that an executed one would, its own process group, and runs its scenario
// as main() would, from the same start: no test has run in it, no thread exists.
//
// The child is the server's, not the test's: its exit status comes back over the socket.
// DDP_TEST_FORK_SERVER=0 turns the server off (the children are executed as before).
#include <sys/types.h>

#include <string>
#include <vector>

namespace ddp_test {
namespace fork_server {

/// Starts the server. Call it first thing in main(), before any thread exists.
void start();

/// Whether a server runs in this process.
bool available();

/// Forks a child of the server that runs its scenario (DDP_TEST_SCENARIO in env) with
/// exactly `env` as its environment, stdout and stderr on out_fd, this process's working
/// folder, and this process's descriptors that are not close-on-exec at the same numbers.
/// Returns its pid (also its process group), or -1 (errno set) if the server failed.
pid_t spawn(const std::vector<std::string>& env, int out_fd);

/// The wait status (as waitpid's) of a child that spawn() returned; blocks until it ends.
int wait(pid_t pid);

}  // namespace fork_server
}  // namespace ddp_test
