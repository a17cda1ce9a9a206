// Replays inputs through a fuzz target without libFuzzer: the main() of the
// fuzz_replay_<name> executables, which any compiler builds (the CTest tests
// fuzz.replay_<name> run them over fuzz/corpus/<name> and fuzz/crashes/<name>).
//
//   fuzz_replay_<name> [--timeout SECONDS] PATH...
//
// Each PATH is a file, or a folder whose regular files are all run (sorted by name, not
// recursing). A PATH that does not exist is skipped with a note (fuzz/crashes/<name> is
// there only while a finding is open); no input at all is an error. An input that
// crashes, fails a check or runs past the timeout (10 s by default) is named on stderr
// and ends the run with a non-zero status. Without AddressSanitizer (which reserves much
// address space) the process may map at most 3 GiB, as libFuzzer's -rss_limit_mb bounds
// the fuzzers: an input that needs more ends in std::bad_alloc, a failure too.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

#if defined(__SANITIZE_ADDRESS__)
#define DDP_FUZZ_REPLAY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DDP_FUZZ_REPLAY_ASAN 1
#endif
#endif

namespace {

char g_current[4096] = "(none)";  // the input being run, for the signal handlers

void say(const char* s) {
  ssize_t ignored = write(2, s, strlen(s));
  (void)ignored;
}

void on_alarm(int) {
  say("fuzz_replay: input ");
  say(g_current);
  say(" ran past the timeout (a hang?)\n");
  _exit(3);
}

void on_crash(int sig) {
  say("fuzz_replay: input ");
  say(g_current);
  say(" crashed (");
  say(strsignal(sig));
  say(")\n");
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out before a crash can cut it off
  unsigned timeout = 10;
  std::vector<std::string> files;
  int first = 1;
  if (argc > 2 && std::string(argv[1]) == "--timeout") {
    timeout = static_cast<unsigned>(std::atoi(argv[2]));
    first = 3;
  }
  for (int i = first; i < argc; ++i) {
    const fs::path p(argv[i]);
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> in_dir;
      for (const auto& e : fs::directory_iterator(p, ec))
        if (e.is_regular_file(ec)) in_dir.push_back(e.path().string());
      std::sort(in_dir.begin(), in_dir.end());
      std::printf("fuzz_replay: %zu input(s) in %s\n", in_dir.size(), argv[i]);
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p.string());
    } else {
      std::printf("fuzz_replay: %s does not exist; skipped\n", argv[i]);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "fuzz_replay: no input to run (usage: %s [--timeout S] PATH...)\n",
                 argv[0]);
    return 2;
  }
#ifndef DDP_FUZZ_REPLAY_ASAN
  const rlimit limit{3ul << 30, 3ul << 30};
  setrlimit(RLIMIT_AS, &limit);
#endif
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  signal(SIGALRM, on_alarm);
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) signal(sig, on_crash);

  const auto start = std::chrono::steady_clock::now();
  size_t bytes = 0;
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "fuzz_replay: cannot read %s\n", f.c_str());
      return 2;
    }
    std::snprintf(g_current, sizeof g_current, "%s", f.c_str());
    alarm(timeout);
    // A copy of exactly the input's size, as libFuzzer passes it, so that a read past the
    // end is caught where the build has AddressSanitizer.
    std::vector<uint8_t> copy(data.begin(), data.end());
    LLVMFuzzerTestOneInput(copy.data(), copy.size());
    alarm(0);
    bytes += data.size();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz_replay: ran %zu input(s), %zu bytes, in %.2f s; none failed\n", files.size(),
              bytes, seconds);
  return 0;
}
