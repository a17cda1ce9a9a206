// Worker output: each pipe is cut into whole lines, which are prefixed and
// written to ddprun's stdout/stderr, so lines of different ranks never mix.
#pragma once

#include <cstddef>
#include <deque>
#include <string>

namespace ddprun {

// Writes all of `data`, retrying short writes. Returns false once the fd is
// broken (e.g. a closed pipe); callers then stop writing there.
bool write_all(int fd, const char* data, size_t len);

class LineStream {
 public:
  // `console_fd` or `file_fd` may be -1 (not wanted). `keep_last` lines are
  // remembered for the failure summary.
  LineStream(int read_fd, std::string prefix, int console_fd, int file_fd, size_t keep_last);
  ~LineStream();
  LineStream(const LineStream&) = delete;
  LineStream& operator=(const LineStream&) = delete;

  int fd() const { return fd_; }
  bool open() const { return fd_ >= 0; }

  // Reads what is there now. At end of file, flushes a last partial line with
  // a newline and closes the pipe.
  void read_available();
  // Gives up on the pipe (e.g. a stray process still holds its write end).
  void close_input();

  const std::deque<std::string>& last_lines() const { return last_; }

 private:
  void consume(const char* data, size_t len);
  void emit_line(const char* data, size_t len, std::string& out);

  int fd_;
  std::string prefix_;
  int console_fd_;
  int file_fd_;
  size_t keep_;
  std::string partial_;
  // A worker that redraws a line with '\r' (a progress bar) gets it shown at once;
  // see Note [Live lines] in output.cpp.
  bool live_ = false;
  std::deque<std::string> last_;
};

}  // namespace ddprun
