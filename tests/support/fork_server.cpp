// The fork server of run_processes: Note [Rank processes from a fork server] (fork_server.h).
#include "support/fork_server.h"

#include "support/harness.h"

#include <ATen/Parallel.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

namespace ddp_test {
namespace fork_server {
namespace {

// A request (test process -> server), one datagram: uint32 count of inherited descriptors,
// their numbers (int32 each), the working folder and the environment's strings, each
// NUL-terminated. SCM_RIGHTS carries the output descriptor, then the inherited ones.
// A reply (server -> test process): Reply, 'P' for a child started (pid, or -errno) and
// 'X' for a child that ended (pid and wait status).
struct Reply {
  char kind;
  int32_t pid;
  int32_t status;
};

constexpr size_t kMaxRequest = 1 << 20;
constexpr int kMaxFds = 200;  // below the kernel's SCM_MAX_FD (253)

struct Client {
  int sock = -1;
  std::mutex mu;
  std::map<pid_t, int> ended;  // statuses read while waiting for something else
};

Client& client() {
  static Client c;
  return c;
}

// A message header over one buffer and a control buffer (for SCM_RIGHTS).
msghdr message(iovec* iov, std::vector<char>* control) {
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control->data();
  msg.msg_controllen = control->size();
  return msg;
}

bool send_reply(int sock, char kind, int32_t pid, int32_t status) {
  const Reply r{kind, pid, status};
  return ::send(sock, &r, sizeof(r), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(r));
}

// In the child, from the server: becomes what an executed child would be, then runs the
// scenario as main() does.
[[noreturn]] void become_child(const sigset_t& old_mask, const std::vector<int>& fds,
                               const std::vector<int32_t>& targets, const char* cwd,
                               std::vector<char*> env) {
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  ::signal(SIGCHLD, SIG_DFL);
  ::setpgid(0, 0);
  // Out of the way of every target number first, then into place (dup2 clears CLOEXEC).
  std::vector<int> moved;
  for (int fd : fds) {
    moved.push_back(::fcntl(fd, F_DUPFD_CLOEXEC, 512));
    ::close(fd);
  }
  ::dup2(moved[0], 1);
  ::dup2(moved[0], 2);
  for (size_t i = 1; i < moved.size(); ++i) ::dup2(moved[i], targets[i - 1]);
  for (int fd : moved) ::close(fd);
  if (::chdir(cwd) != 0) {
    std::fprintf(stderr, "fork server: chdir(%s) failed: %s\n", cwd, std::strerror(errno));
    std::_Exit(127);
  }
  ::clearenv();
  for (char* kv : env) ::putenv(kv);  // the strings live on in this process
  // LibTorch's intra-op threads follow OMP_NUM_THREADS as an executed child's would: the
  // OpenMP runtime read it when the test process started, before this value was set.
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(omp);
    if (n > 0) at::set_num_threads(n);
  }
  int code = 2;
  if (!maybe_run_scenario(&code)) {
    std::fprintf(stderr, "fork server: the child has no DDP_TEST_SCENARIO\n");
  }
  std::exit(code);
}

// A request's fields; cwd and env point into the received buffer.
struct Request {
  std::vector<int32_t> targets;
  const char* cwd = nullptr;
  std::vector<char*> env;
};

// Reads a request of n bytes that came with n_fds descriptors (the output one first).
bool parse_request(char* buf, size_t n, size_t n_fds, Request* req) {
  uint32_t count = 0;
  if (n < sizeof(count) || buf[n - 1] != '\0') return false;
  std::memcpy(&count, buf, sizeof(count));
  char* at = buf + sizeof(count);
  char* end = buf + n;
  if (count + 1 != n_fds || static_cast<size_t>(end - at) <= count * sizeof(int32_t)) return false;
  req->targets.resize(count);
  std::memcpy(req->targets.data(), at, count * sizeof(int32_t));
  at += count * sizeof(int32_t);
  req->cwd = at;
  at += std::strlen(at) + 1;
  while (at < end) {
    req->env.push_back(at);
    at += std::strlen(at) + 1;
  }
  return true;
}

void reap(int sock) {
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    if (!send_reply(sock, 'X', pid, status)) std::_Exit(0);
  }
}

[[noreturn]] void serve(int sock) {
  sigset_t chld, old_mask;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, &old_mask);
  const int sfd = ::signalfd(-1, &chld, SFD_CLOEXEC);
  if (sfd < 0) std::_Exit(1);
  std::vector<char> buf(kMaxRequest);
  std::vector<char> control(CMSG_SPACE(sizeof(int) * (kMaxFds + 1)));
  for (;;) {
    pollfd p[2] = {{sock, POLLIN, 0}, {sfd, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      std::_Exit(1);
    }
    if (p[1].revents & POLLIN) {
      signalfd_siginfo info;
      (void)!::read(sfd, &info, sizeof(info));
      reap(sock);
    }
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    iovec iov{buf.data(), buf.size()};
    msghdr msg = message(&iov, &control);
    const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0) std::_Exit(0);  // the test process is gone
    std::vector<int> fds;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const int* data = reinterpret_cast<const int*>(CMSG_DATA(c));
        fds.insert(fds.end(), data, data + count);
      }
    }
    Request req;
    if (!parse_request(buf.data(), static_cast<size_t>(n), fds.size(), &req)) {
      for (int fd : fds) ::close(fd);
      if (!send_reply(sock, 'P', -EINVAL, 0)) std::_Exit(0);
      continue;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(sock);
      ::close(sfd);
      become_child(old_mask, fds, req.targets, req.cwd, req.env);
    }
    const int err = errno;
    if (pid > 0) ::setpgid(pid, pid);  // also here, so that no kill(-pid) can come first
    for (int fd : fds) ::close(fd);
    if (!send_reply(sock, 'P', pid > 0 ? pid : -err, 0)) std::_Exit(0);
  }
}

// One reply, blocking. False when the server is gone.
bool read_reply(Client& c, Reply* r) {
  for (;;) {
    const ssize_t n = ::recv(c.sock, r, sizeof(*r), 0);
    if (n == static_cast<ssize_t>(sizeof(*r))) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

std::vector<int> inherited_fds() {
  std::vector<int> out;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  const int own = ::dirfd(dir);
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == own) continue;
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) == 0) out.push_back(fd);
  }
  ::closedir(dir);
  return out;
}

}  // namespace

void start() {
  const char* off = std::getenv("DDP_TEST_FORK_SERVER");
  if (off != nullptr && std::string(off) == "0") return;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(sv[0]);
    ::close(sv[1]);
    return;
  }
  if (pid == 0) {
    ::close(sv[0]);
    serve(sv[1]);
  }
  ::close(sv[1]);
  client().sock = sv[0];
}

bool available() { return client().sock >= 0; }

pid_t spawn(const std::vector<std::string>& env, int out_fd) {
  Client& c = client();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.sock < 0) {
    errno = ENOSYS;
    return -1;
  }
  std::vector<int> fds{out_fd};
  const std::vector<int> inherited = inherited_fds();
  if (inherited.size() > static_cast<size_t>(kMaxFds)) {
    errno = EMFILE;
    return -1;
  }
  fds.insert(fds.end(), inherited.begin(), inherited.end());
  std::string payload;
  const uint32_t count = static_cast<uint32_t>(inherited.size());
  payload.append(reinterpret_cast<const char*>(&count), sizeof(count));
  for (int fd : inherited) {
    const int32_t t = fd;
    payload.append(reinterpret_cast<const char*>(&t), sizeof(t));
  }
  char cwd[PATH_MAX];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) return -1;
  payload.append(cwd);
  payload.push_back('\0');
  for (const auto& kv : env) {
    payload.append(kv);
    payload.push_back('\0');
  }
  if (payload.size() > kMaxRequest) {
    errno = E2BIG;
    return -1;
  }
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  iovec iov{payload.data(), payload.size()};
  msghdr msg = message(&iov, &control);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
  if (::sendmsg(c.sock, &msg, MSG_NOSIGNAL) < 0) return -1;
  for (;;) {
    Reply r{};
    if (!read_reply(c, &r)) {
      errno = EPIPE;
      return -1;
    }
    if (r.kind == 'X') {
      c.ended[r.pid] = r.status;
    } else if (r.kind == 'P') {
      if (r.pid < 0) {
        errno = -r.pid;
        return -1;
      }
      return r.pid;
    }
  }
}

int wait(pid_t pid) {
  Client& c = client();
  std::lock_guard<std::mutex> lock(c.mu);
  for (;;) {
    auto it = c.ended.find(pid);
    if (it != c.ended.end()) {
      const int status = it->second;
      c.ended.erase(it);
      return status;
    }
    Reply r{};
    if (!read_reply(c, &r)) {
      throw std::runtime_error("the fork server of run_processes ended before child " +
                               std::to_string(pid) + " did; rerun with DDP_TEST_FORK_SERVER=0");
    }
    if (r.kind == 'X') c.ended[r.pid] = r.status;
  }
}

}  // namespace fork_server
}  // namespace ddp_test
