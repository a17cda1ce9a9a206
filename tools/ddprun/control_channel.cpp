#include "control_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "sysinfo.h"

namespace ddprun {

Connection::Connection(int fd) : last_received(now_seconds()), last_sent(now_seconds()), fd_(fd) {
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

Connection::~Connection() { close(); }

void Connection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool Connection::send_line(const std::string& line) {
  if (fd_ < 0) return false;
  std::string msg = line.substr(0, kMaxMessage - 1) + "\n";
  const char* p = msg.data();
  size_t left = msg.size();
  double give_up = now_seconds() + 5;
  while (left > 0) {
    ssize_t n = ::send(fd_, p, left, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      left -= static_cast<size_t>(n);
    } else if (n < 0 && (errno == EINTR || errno == EAGAIN) && now_seconds() < give_up) {
      pollfd pfd{fd_, POLLOUT, 0};
      ::poll(&pfd, 1, 100);
    } else {
      return false;
    }
  }
  last_sent = now_seconds();
  return true;
}

bool Connection::read_lines(std::vector<std::string>& lines) {
  if (fd_ < 0) return false;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      last_received = now_seconds();
      buffer_.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = buffer_.find('\n')) != std::string::npos) {
        lines.push_back(buffer_.substr(0, nl));
        buffer_.erase(0, nl + 1);
      }
      if (buffer_.size() > kMaxMessage) return false;  // not a ddprun peer
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return true;
    } else {
      return false;
    }
  }
}

void Connection::close_gracefully(double deadline) {
  if (fd_ < 0) return;
  ::shutdown(fd_, SHUT_WR);
  char buf[4096];
  for (;;) {
    double left = deadline - now_seconds();
    if (left <= 0) break;
    pollfd pfd{fd_, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left * 1000) + 1) <= 0) continue;
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;
  }
  close();
}

std::string peer_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {0};
  const void* where = nullptr;
  if (addr.ss_family == AF_INET) where = &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr;
  if (addr.ss_family == AF_INET6) where = &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr;
  if (!where || !inet_ntop(addr.ss_family, where, text, sizeof(text))) return "";
  return text;
}

std::string JobView::address(int node) const {
  for (const auto& [n, addr] : peers)
    if (n == node) return addr;
  return "";
}

static addrinfo* resolve(const std::string& addr, int port, bool passive, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    error = "cannot resolve '" + addr + "': " + gai_strerror(rc);
    return nullptr;
  }
  return res;
}

int listen_tcp(const std::string& addr, int port, std::string& error) {
  addrinfo* res = resolve(addr, port, true, error);
  if (!res) return -1;
  int fd = -1;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0) break;
    error = std::strerror(errno);
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

int handed_listener(const std::string& fd_text, int port, std::string& error) {
  char* end = nullptr;
  const long fd = std::strtol(fd_text.c_str(), &end, 10);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  int listening = 0;
  socklen_t optlen = sizeof(listening);
  if (fd_text.empty() || *end != '\0' || fd < 0 || fd > INT_MAX ||
      getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) != 0 ||
      listening == 0) {
    error = "not a listening socket of this process";
    return -1;
  }
  int bound = 0;
  if (addr.ss_family == AF_INET) bound = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) bound = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  if (bound != port) {
    error = "it listens on port " + std::to_string(bound) + ", but --rdzv-port is " +
            std::to_string(port);
    return -1;
  }
  // Ours now: not inherited by the workers, and polled like a socket we made.
  const int f = static_cast<int>(fd);
  fcntl(f, F_SETFD, fcntl(f, F_GETFD) | FD_CLOEXEC);
  fcntl(f, F_SETFL, fcntl(f, F_GETFL) | O_NONBLOCK);
  return f;
}

int connect_tcp(const std::string& addr, int port, double timeout_s, std::string& error) {
  addrinfo* res = resolve(addr, port, false, error);
  if (!res) return -1;
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{fd, POLLOUT, 0};
      rc = ::poll(&pfd, 1, static_cast<int>(timeout_s * 1000));
      int err = ETIMEDOUT;
      socklen_t len = sizeof(err);
      if (rc > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      errno = err;
      rc = err == 0 ? 0 : -1;
    }
    if (rc != 0) {
      error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  return fd;
}

}  // namespace ddprun
