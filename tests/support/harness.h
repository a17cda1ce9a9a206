#pragma once

// Helpers for tests that run several ranks.
//
//   run_threads(n, fn)        n threads, each its own ProcessGroup over a FileStore in a
//                             fresh private directory: fast, one process.
//   run_processes(n, "name")  n real processes, each as if this test binary were executed
//                             again with DDP_TEST_SCENARIO=name and torchrun's variables
//                             set: the scenario registered under that name runs as main().
//                             They come from a fork server (Note [Rank processes from a
//                             fork server], fork_server.h), or from an execve where none
//                             runs or ProcessOptions::args are given.
//
// Both collect every rank's failure and report the first, with its rank.

#include <ddp/distributed/process_group.h>

#include <c10/util/Exception.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ddp_test {

/// A fresh directory (mode 0700), removed with its contents at scope exit.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// A TCP port of loopback held by this process for its lifetime: bound (to port 0, so the
/// kernel picks a free one) and, with listen = true, listening. Nothing else can take the
/// port meanwhile, so tests started at once never collide. A listening port is handed to
/// the store of rank 0 through DDP_MASTER_LISTEN_FD (Note [Handed-over port] in
/// src/distributed/rendezvous/rendezvous.cpp); a port bound without listening refuses every connection.
class HeldPort {
 public:
  explicit HeldPort(bool listen = true);
  ~HeldPort();
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;
  int port() const { return port_; }
  int fd() const { return fd_; }
  /// Gives up ownership: the descriptor now belongs to whoever it was handed to.
  int release();

 private:
  int fd_ = -1;
  int port_ = 0;
};

/// The socket inodes that listen on TCP `port` (fstat(fd).st_ino names a socket's own).
std::vector<unsigned long> listening_inodes(int port);

/// Polls `predicate` until it holds or `timeout` passes; returns its last value.
bool wait_for(const std::function<bool()>& predicate, std::chrono::milliseconds timeout);

/// InitOptions for rank `rank` of `world` over a FileStore under `dir`, on backend
/// DDP_TEST_BACKEND ("gloo" when unset).
ddp::InitOptions file_init(const TempDir& dir, int rank, int world,
                           std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// A non-owning shared_ptr for run_thread_groups' ProcessGroup&, for the APIs that take
/// a std::shared_ptr<ProcessGroup>.
inline std::shared_ptr<ddp::ProcessGroup> borrow(ddp::ProcessGroup& pg) {
  return std::shared_ptr<ddp::ProcessGroup>(&pg, [](ddp::ProcessGroup*) {});
}

/// Whether `p` lies in a mapping of one of ddp-cpp's shared memory segments:
/// /proc/self/maps shows "/memfd:ddp-... (deleted)", or "/dev/shm/ddp-... (deleted)" for
/// a named one.
bool in_shared_segment(const void* p);

/// Runs fn(rank) on `world` threads; rethrows the first failure, prefixed by its rank.
void run_threads(int world, const std::function<void(int rank)>& fn);

/// Like run_threads, but each thread gets its own ProcessGroup (FileStore rendezvous).
void run_thread_groups(int world, const std::function<void(ddp::ProcessGroup& pg)>& fn,
                       std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// Two copies of a `world`-rank run_thread_groups job at once, on groups made by
/// ddp::new_subgroups: 2 * world threads, the first copy on global ranks [0, world), the
/// second on [world, 2 * world) (whose group ranks are not their global ones). fn gets
/// this thread's subgroup. Afterwards a third group, {r, r + world}, all-reduces across
/// the copies (checked), so that the subgroups were not the only groups in use.
void run_subgroup_copies(int world, const std::function<void(ddp::ProcessGroup& pg)>& fn,
                         std::chrono::milliseconds timeout = std::chrono::seconds(30));

struct ProcessResult {
  int rank = 0;
  int exit_code = 0;   // 128 + signal when killed
  std::string output;  // stdout and stderr together
};

struct ProcessOptions {
  /// Extra environment for every rank; "{rank}" in a value is replaced by the rank.
  std::map<std::string, std::string> env;
  /// Extra arguments after the binary.
  std::vector<std::string> args;
  /// Killed (SIGKILL) after this long; the result says 137.
  std::chrono::milliseconds timeout = std::chrono::seconds(90);
  /// Set torchrun's variables (RANK, WORLD_SIZE, ...) and DDP_RENDEZVOUS_DIR.
  bool launcher_env = true;
};

/// Runs scenario `name` in `world` processes and waits for all of them.
std::vector<ProcessResult> run_processes(int world, const std::string& name,
                                         const ProcessOptions& options = ProcessOptions());

/// Fails the current test (with each rank's output) unless every rank exited 0.
void expect_all_ok(const std::vector<ProcessResult>& results);

/// The exception text of f(), or "<no exception>": a c10::Error's message without its
/// backtrace, so that tests can pin substrings.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.msg();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

/// Runs a command with /bin/sh; returns its exit code and fills output.
int run_command(const std::string& command, std::string* output = nullptr);

using Scenario = std::function<int()>;
/// Registers a scenario; use the DDP_SCENARIO macro.
bool register_scenario(const std::string& name, Scenario fn);
/// Runs the scenario named by DDP_TEST_SCENARIO, if set (called from main).
bool maybe_run_scenario(int* exit_code);

/// This checkout's root and build folder. In one file only (harness.cpp), so that the
/// other test sources compile alike in every clone and a compiler cache serves them.
const char* source_dir();
const char* binary_dir();

}  // namespace ddp_test

/// A function that a run_processes child executes as its main(); return its exit code.
#define DDP_SCENARIO(name)                                        \
  static int ddp_scenario_##name();                               \
  static const bool ddp_scenario_registered_##name =              \
      ::ddp_test::register_scenario(#name, &ddp_scenario_##name); \
  static int ddp_scenario_##name()

#define DDP_SOURCE_DIR ::ddp_test::source_dir()
#define DDP_BINARY_DIR ::ddp_test::binary_dir()
