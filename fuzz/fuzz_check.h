// What the fuzz targets share: a check that stays on in release builds (assert() is off
// under NDEBUG, which the project's RelWithDebInfo build defines), so that a broken
// property is a crash both under libFuzzer and in the corpus replay (fuzz/replay_main.cpp).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>

#define FUZZ_CHECK(cond, what)                                                           \
  do {                                                                                   \
    if (!(cond)) ::ddp_fuzz::check_failed(#cond, std::string(what), __FILE__, __LINE__); \
  } while (0)

namespace ddp_fuzz {

[[noreturn]] inline void check_failed(const char* cond, const std::string& what, const char* file,
                                      int line) {
  std::fprintf(stderr, "fuzz check failed at %s:%d: %s\n  %s\n", file, line, cond, what.c_str());
  std::fflush(stderr);
  std::abort();
}

// `s` for a message: printable ASCII as is, other bytes as \xNN, cut after `max` bytes.
inline std::string escaped(const std::string& s, size_t max = 200) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (size_t k = 0; k < s.size() && k < max; ++k) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

// A refusal must say which file it is about: its message names `file`.
inline void expect_names_file(const std::exception& e, const std::string& file) {
  const std::string message = e.what();
  if (message.find(file) == std::string::npos)
    check_failed("message names the file",
                 "a refusal that does not name the file: " + escaped(message), __FILE__, __LINE__);
}

// For readers that take a path: a folder of this process's own, made once under $TMPDIR
// (else /dev/shm, else /tmp) and removed at exit.
inline const std::string& scratch_dir() {
  static std::string dir;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    const std::string base = tmp && *tmp                       ? tmp
                             : ::access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                                                               : "/tmp";
    dir = base + "/ddp-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    });
  }
  return dir;
}

// The input written to scratch_dir()/name; its path.
inline std::string input_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) check_failed("f != nullptr", "cannot write " + path, __FILE__, __LINE__);
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

}  // namespace ddp_fuzz
