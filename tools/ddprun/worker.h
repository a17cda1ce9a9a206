// One worker process: how it is started and how its process tree is ended.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ddprun {

struct Worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;  // also its process group id: the worker leads its own group
  bool reaped = false;
  int wait_status = 0;
  bool sent_term = false;   // its group got SIGTERM while stopping
  bool group_gone = false;  // reaped and its group found empty
};

// Starts `argv` (program found beforehand) in a new process group, with `env`
// as its whole environment, stdin from /dev/null and stdout/stderr on the given
// pipe ends. Returns the pid, or -1 with `error` set.
pid_t spawn_worker(const std::string& program, const std::vector<std::string>& argv,
                   const std::vector<std::string>& env, int stdout_fd, int stderr_fd,
                   std::string& error);

// Whether any process is left in the worker's group (its descendants that did
// not leave it). Once the worker is reaped and the group is empty this stays
// false, so a process group that later reuses the id is never signalled.
bool group_alive(Worker& w);

void signal_group(Worker& w, int sig);

// Sends SIGKILL to every child of ddprun that is not a worker: descendants that
// left their worker's group and were handed to ddprun (the child subreaper)
// when their parent died. Returns their pids.
std::vector<pid_t> kill_stray_children(const std::vector<Worker>& workers);

// Reaps the given children of ddprun, waiting up to `timeout_s` for them to die.
void reap_children(const std::vector<pid_t>& pids, double timeout_s);

// Exit code for a wait status: the code itself, or 128 + signal.
int exit_code_of(int wait_status);
// "exit code 3" or "signal SIGKILL (9)".
std::string describe_status(int wait_status);
std::string signal_name(int sig);

}  // namespace ddprun
