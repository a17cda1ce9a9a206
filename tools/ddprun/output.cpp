#include "output.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ddprun {

namespace {
// A line longer than this is cut, so one worker cannot make ddprun hold
// unbounded memory by never printing a newline.
constexpr size_t kMaxLine = 1 << 20;
constexpr size_t kKeptLineChars = 1000;
}  // namespace

bool write_all(int fd, const char* data, size_t len) {
  while (len > 0) {
    ssize_t n = ::write(fd, data, len);
    if (n > 0) {
      data += n;
      len -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else {
      return false;
    }
  }
  return true;
}

LineStream::LineStream(int read_fd, std::string prefix, int console_fd, int file_fd,
                       size_t keep_last)
    : fd_(read_fd),
      prefix_(std::move(prefix)),
      console_fd_(console_fd),
      file_fd_(file_fd),
      keep_(keep_last) {}

LineStream::~LineStream() {
  close_input();
  if (file_fd_ >= 0) ::close(file_fd_);
}

void LineStream::read_available() {
  char buf[65536];
  while (fd_ >= 0) {
    ssize_t n = ::read(fd_, buf, sizeof(buf));
    if (n > 0) {
      consume(buf, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof(buf)) return;  // let the other pipes have a turn
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return;
    } else {
      close_input();
    }
  }
}

void LineStream::close_input() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  if (!partial_.empty()) {
    std::string out;
    emit_line(partial_.data(), partial_.size(), out);
    partial_.clear();
    if (console_fd_ >= 0 && !write_all(console_fd_, out.data(), out.size())) console_fd_ = -1;
  }
}

void LineStream::consume(const char* data, size_t len) {
  if (file_fd_ >= 0 && !write_all(file_fd_, data, len)) {
    ::close(file_fd_);
    file_fd_ = -1;
  }
  // All whole lines of this chunk go out in one write().
  std::string out;
  size_t start = 0;
  while (start < len) {
    const void* nl = std::memchr(data + start, '\n', len - start);
    if (!nl) {
      partial_.append(data + start, len - start);
      if (partial_.size() >= kMaxLine) {
        emit_line(partial_.data(), partial_.size(), out);
        partial_.clear();
      }
      break;
    }
    size_t end = static_cast<size_t>(static_cast<const char*>(nl) - data);
    if (partial_.empty()) {
      emit_line(data + start, end - start, out);
    } else {
      partial_.append(data + start, end - start);
      emit_line(partial_.data(), partial_.size(), out);
      partial_.clear();
    }
    start = end + 1;
  }
  // Note [Live lines]: a partial line that contains '\r' is a line being redrawn in
  // place (a progress bar). Only what follows the last '\r' is still visible, so keep
  // just that and show it now, from column 0, instead of holding it until a newline.
  // The line that finally ends it starts with '\r' too, to replace the live one.
  const size_t cr = partial_.rfind('\r');
  if (cr != std::string::npos) {
    partial_.erase(0, cr + 1);
    live_ = true;
    out += '\r';
    out += prefix_;
    out += partial_;
  }
  if (!out.empty() && console_fd_ >= 0 && !write_all(console_fd_, out.data(), out.size()))
    console_fd_ = -1;
}

void LineStream::emit_line(const char* data, size_t len, std::string& out) {
  // Only the text after the last '\r' of a line is visible on a terminal (a "\r\n"
  // ending aside); print that, so the prefix is not overwritten.
  if (len > 0 && data[len - 1] == '\r') --len;
  for (size_t i = len; i > 0; --i) {
    if (data[i - 1] == '\r') {
      data += i;
      len -= i;
      break;
    }
  }
  if (keep_ > 0) {
    last_.emplace_back(data, len < kKeptLineChars ? len : kKeptLineChars);
    if (last_.size() > keep_) last_.pop_front();
  }
  if (console_fd_ < 0) return;
  if (live_) {
    out += '\r';
    live_ = false;
  }
  out += prefix_;
  out.append(data, len);
  out += '\n';
}

}  // namespace ddprun
