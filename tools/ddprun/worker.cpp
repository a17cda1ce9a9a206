#include "worker.h"

#include "options.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ddprun {

namespace {

// Runs between fork and exec, so it sticks to async-signal-safe calls.
[[noreturn]] void child_fail(const char* what, int err) {
  char buf[512];
  int n = snprintf(buf, sizeof(buf), "ddprun: worker setup failed: %s: %s\n", what, strerror(err));
  if (n > 0) (void)!write(STDERR_FILENO, buf, static_cast<size_t>(n));
  _exit(kExitNotFound);
}

}  // namespace

pid_t spawn_worker(const std::string& program, const std::vector<std::string>& argv,
                   const std::vector<std::string>& env, int stdout_fd, int stderr_fd,
                   std::string& error) {
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  // Signals stay blocked across fork so that ddprun's handlers never run in the
  // child (they would write into ddprun's own signal pipe).
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; ++s) sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (setpgid(0, 0) != 0) child_fail("setpgid", errno);
    // If ddprun dies without cleaning up, its workers must not run on alone.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_fail("prctl", errno);
    if (getppid() != parent) _exit(exit_code_for_signal(SIGKILL));
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull < 0 || dup2(devnull, STDIN_FILENO) < 0) child_fail("stdin", errno);
    if (devnull != STDIN_FILENO) close(devnull);
    if (dup2(stdout_fd, STDOUT_FILENO) < 0 || dup2(stderr_fd, STDERR_FILENO) < 0)
      child_fail("dup2", errno);
    execve(program.c_str(), cargv.data(), cenv.data());
    // A script without #! runs under sh, as with execvp. ddprun is single-threaded,
    // so allocating here is safe.
    if (errno == ENOEXEC) {
      std::vector<char*> sh{const_cast<char*>("/bin/sh"), const_cast<char*>(program.c_str())};
      for (size_t i = 1; cargv[i]; ++i) sh.push_back(cargv[i]);
      sh.push_back(nullptr);
      execve("/bin/sh", sh.data(), cenv.data());
    }
    child_fail(program.c_str(), errno);
  }
  int fork_errno = errno;
  if (pid > 0) setpgid(pid, pid);  // both sides set it, so killpg works at once
  sigprocmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) error = std::string("fork: ") + strerror(fork_errno);
  return pid;
}

bool group_alive(Worker& w) {
  if (w.pid <= 0 || w.group_gone) return false;
  if (kill(-w.pid, 0) == 0 || errno == EPERM) return true;
  w.group_gone = w.reaped;
  return false;
}

void signal_group(Worker& w, int sig) {
  if (w.pid > 0 && !w.group_gone) kill(-w.pid, sig);
}

namespace {

// /proc/<pid>/stat, or "" once the process is gone. read() fails with ESRCH when it
// exits between open and read, which std::ifstream turns into an exception.
std::string read_proc_stat(const char* pid) {
  const int fd = open(("/proc/" + std::string(pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[1024];
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

}  // namespace

std::vector<pid_t> kill_stray_children(const std::vector<Worker>& workers) {
  std::vector<pid_t> killed;
  DIR* proc = opendir("/proc");
  if (!proc) return killed;
  const pid_t self = getpid();
  while (dirent* d = readdir(proc)) {
    char* end = nullptr;
    long pid = strtol(d->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    const std::string text = read_proc_stat(d->d_name);
    size_t paren = text.rfind(')');  // the command name may hold spaces and ')'
    if (paren == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (sscanf(text.c_str() + paren + 1, " %c %ld", &state, &ppid) != 2 || ppid != self) continue;
    bool is_worker = false;
    for (const auto& w : workers) is_worker = is_worker || (w.pid == pid && !w.reaped);
    if (is_worker || state == 'Z') continue;
    kill(static_cast<pid_t>(pid), SIGKILL);
    killed.push_back(static_cast<pid_t>(pid));
  }
  closedir(proc);
  return killed;
}

void reap_children(const std::vector<pid_t>& pids, double timeout_s) {
  for (int waited_ms = 0;; waited_ms += 10) {
    bool all = true;
    for (pid_t pid : pids) {
      int status;
      pid_t r = waitpid(pid, &status, WNOHANG);
      all = all && (r == pid || (r < 0 && errno == ECHILD));
    }
    if (all || waited_ms >= timeout_s * 1000) return;
    usleep(10000);
  }
}

int exit_code_of(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return exit_code_for_signal(WTERMSIG(wait_status));
  return 1;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string describe_status(int wait_status) {
  if (WIFEXITED(wait_status)) return "exit code " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    int sig = WTERMSIG(wait_status);
    return "signal " + signal_name(sig) + " (" + std::to_string(sig) + ")";
  }
  return "unknown status " + std::to_string(wait_status);
}

}  // namespace ddprun
