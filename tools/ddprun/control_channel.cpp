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
#include <exception>

#include "sysinfo.h"

namespace ddprun {

namespace {

constexpr size_t kMaxWaiting = 32;  // lines sent before the handshake ended (hello, pings)

}  // namespace

Connection::Connection(int fd, const auth::Bytes* secret, auth::Role role)
    : opened(now_seconds()),
      last_received(opened),
      last_sent(opened),
      fd_(fd),
      peer_(peer_endpoint(fd)) {
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
  if (!secret || secret->empty()) return;
  try {
    handshake_.emplace(*secret, role);
  } catch (const std::exception& e) {  // no random nonce: nothing can be trusted
    handshake_.emplace(*secret, role, auth::Bytes(auth::kNonceBytes, 0));
    fail(Failure::Handshake, e.what());
    return;
  }
  write_line(handshake_->hello());
}

Connection::~Connection() { close(); }

void Connection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Connection::fail(Failure how, const std::string& why) {
  failure_ = how;
  failure_text_ = why;
  buffer_.clear();
  waiting_.clear();
}

bool Connection::send_line(const std::string& line) {
  if (fd_ < 0) return false;
  std::string msg = line.substr(0, kMaxMessage - 1);
  if (!handshake_) return write_line(msg);
  if (!channel_) {  // sent, signed, once the peer has proved that it holds the secret
    if (failure_ != Failure::None) return false;
    if (waiting_.size() < kMaxWaiting) waiting_.push_back(std::move(msg));
    return true;
  }
  // (Also after a bad line from the peer: what this end signs is still its own.)
  return write_line(channel_->seal(msg));
}

bool Connection::write_line(const std::string& line) {
  if (fd_ < 0) return false;
  std::string msg = line + "\n";
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

// One received line: the handshake's, or a message (checked first with a secret).
bool Connection::take(const std::string& line, std::vector<std::string>& lines) {
  if (!handshake_) {
    lines.push_back(line);
    return true;
  }
  std::string text, error;
  if (!channel_) {
    const auth::Handshake::Step step = handshake_->take(line, text, error);
    if (step == auth::Handshake::Step::Failed) {
      fail(Failure::Handshake, error);
      return false;
    }
    if (!text.empty()) write_line(text);  // this end's proof
    if (step == auth::Handshake::Step::Done) {
      channel_ = handshake_->channel();
      for (const std::string& waiting : waiting_) write_line(channel_->seal(waiting));
      waiting_.clear();
    }
    return true;
  }
  if (!channel_->open(line, text, error)) {
    fail(Failure::Line, error);
    return false;
  }
  lines.push_back(std::move(text));
  return true;
}

bool Connection::read_lines(std::vector<std::string>& lines) {
  if (fd_ < 0 || failure_ != Failure::None) return false;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      last_received = now_seconds();
      buffer_.append(buf, static_cast<size_t>(n));
      size_t start = 0, nl;
      while ((nl = buffer_.find('\n', start)) != std::string::npos) {
        const std::string line = buffer_.substr(start, nl - start);
        start = nl + 1;
        if (!take(line, lines)) return false;
      }
      buffer_.erase(0, start);
      // Not a ddprun peer (or one before its handshake, whose lines are short).
      const size_t limit = !handshake_ ? kMaxMessage
                           : channel_  ? kMaxMessage + auth::kSealOverhead
                                       : auth::kMaxHandshakeLine;
      if (buffer_.size() > limit) {
        fail(Failure::TooLong, "it sent more than " + std::to_string(limit) +
                                   " bytes without a line break" +
                                   (authenticated() ? "" : " before authenticating"));
        return false;
      }
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

std::string peer_endpoint(int fd) {
  const std::string addr = peer_address(fd);
  if (addr.empty()) return "?";
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  int port = 0;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    if (ss.ss_family == AF_INET) port = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    if (ss.ss_family == AF_INET6) port = ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  }
  const bool v6 = addr.find(':') != std::string::npos;
  return (v6 ? "[" + addr + "]" : addr) + ":" + std::to_string(port);
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
