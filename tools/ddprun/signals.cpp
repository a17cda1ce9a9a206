#include "signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

namespace ddprun {

namespace {
int g_pipe[2] = {-1, -1};

void on_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  (void)!write(g_pipe[1], &byte, 1);  // a full pipe already holds a wake-up
  errno = saved;
}
}  // namespace

void install_signal_pipe() {
  if (pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaction(sig, &sa, nullptr);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, nullptr);
}

int signal_pipe_fd() { return g_pipe[0]; }

std::vector<int> take_signals() {
  std::vector<int> out;
  unsigned char buf[64];
  for (;;) {
    ssize_t n = read(g_pipe[0], buf, sizeof(buf));
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) out.push_back(buf[i]);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  return out;
}

}  // namespace ddprun
