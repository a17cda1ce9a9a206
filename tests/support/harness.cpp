#include "support/harness.h"

#include "support/fork_server.h"

#include <ddp/distributed/groups.h>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace ddp_test {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ddp-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    throw std::runtime_error("mkdtemp failed: " + std::string(std::strerror(errno)));
  }
  path_ = buf.data();
}

TempDir::~TempDir() {
  if (!path_.empty()) run_command("rm -rf '" + path_ + "'");
}

std::vector<unsigned long> listening_inodes(int port) {
  // Lines: "sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...",
  // addresses as HEXIP:HEXPORT, st 0A = LISTEN.
  char wanted[8];
  std::snprintf(wanted, sizeof(wanted), ":%04X", port);
  std::vector<unsigned long> inodes;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
      unsigned long inode = 0;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (state == "0A" && local.size() >= 5 && local.compare(local.size() - 5, 5, wanted) == 0) {
        inodes.push_back(inode);
      }
    }
  }
  return inodes;
}

bool wait_for(const std::function<bool()>& predicate, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return predicate();
}

HeldPort::HeldPort(bool listen) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      (listen && ::listen(fd_, 128) != 0) ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw std::runtime_error("could not bind a port on 127.0.0.1: " + why);
  }
  port_ = ntohs(addr.sin_port);
}

HeldPort::~HeldPort() {
  if (fd_ >= 0) ::close(fd_);
}

int HeldPort::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

ddp::InitOptions file_init(const TempDir& dir, int rank, int world,
                           std::chrono::milliseconds timeout) {
  // DDP_TEST_BACKEND runs the same tests on another CPU backend ("shm", or "" to let
  // the library choose); CTest's parallel.on_shm does.
  const char* backend = std::getenv("DDP_TEST_BACKEND");
  return ddp::InitOptions()
      .backend(backend != nullptr ? backend : "gloo")
      .init_method("file://" + dir.file("store"))
      .rank(rank)
      .world_size(world)
      .timeout(timeout);
}

bool in_shared_segment(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx", &lo, &hi) != 2) continue;
    if (addr >= lo && addr < hi) {
      return line.find("/dev/shm/ddp-") != std::string::npos ||
             line.find("/memfd:ddp-") != std::string::npos;
    }
  }
  return false;
}

void run_threads(int world, const std::function<void(int)>& fn) {
  std::mutex mu;
  std::vector<std::string> errors(world);
  std::vector<std::exception_ptr> eptrs(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        eptrs[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  // Every failing rank is named: the first rank's error is often only the consequence
  // of another rank's (a peer that left the group).
  std::string all;
  for (int r = 0; r < world; ++r) {
    if (!eptrs[r]) continue;
    try {
      std::rethrow_exception(eptrs[r]);
    } catch (const c10::Error& e) {
      all += (all.empty() ? "" : "\n") + ("rank " + std::to_string(r) + ": ") + e.msg();
    } catch (const std::exception& e) {
      all += (all.empty() ? "" : "\n") + ("rank " + std::to_string(r) + ": ") + e.what();
    }
  }
  if (!all.empty()) throw std::runtime_error(all);
}

void run_thread_groups(int world, const std::function<void(ddp::ProcessGroup&)>& fn,
                       std::chrono::milliseconds timeout) {
  TempDir dir;
  run_threads(world, [&](int rank) {
    auto pg = ddp::ProcessGroup::create(file_init(dir, rank, world, timeout));
    // Every rank has finished connecting before any body runs: a body that ends at once
    // (an error before any collective) would otherwise release its group while a peer
    // is still connecting to it.
    pg->barrier();
    fn(*pg);
  });
}

void run_subgroup_copies(int world, const std::function<void(ddp::ProcessGroup&)>& fn,
                         std::chrono::milliseconds timeout) {
  run_thread_groups(
      2 * world,
      [&](ddp::ProcessGroup& parent) {
        auto all = borrow(parent);
        const auto mine = ddp::new_subgroups(world, ddp::GroupOptions(), all).first;
        std::vector<std::vector<int>> pairs;
        for (int r = 0; r < world; ++r) pairs.push_back({r, r + world});
        const auto across =
            ddp::new_subgroups_by_enumeration(pairs, ddp::GroupOptions(), all).first;
        fn(*mine);
        at::Tensor t = at::full({1}, static_cast<float>(parent.rank()));
        across->all_reduce(t);
        const float want = static_cast<float>(2 * (parent.rank() % world) + world);
        if (t.item<float>() != want) {
          throw std::runtime_error("run_subgroup_copies: the group across the copies summed " +
                                   std::to_string(t.item<float>()) + ", not " +
                                   std::to_string(want));
        }
      },
      timeout);
}

namespace {

std::string substitute(std::string value, int rank) {
  const std::string key = "{rank}";
  for (auto pos = value.find(key); pos != std::string::npos; pos = value.find(key)) {
    value.replace(pos, key.size(), std::to_string(rank));
  }
  return value;
}

}  // namespace

std::vector<ProcessResult> run_processes(int world, const std::string& name,
                                         const ProcessOptions& options) {
  TempDir rdzv;
  struct Child {
    pid_t pid = -1;
    int fd = -1;
    ProcessResult result;
    bool done = false;
    bool from_server = false;  // Note [Rank processes from a fork server]
  };
  std::vector<Child> children(world);
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv(*e);
      const auto eq = kv.find('=');
      if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    env["DDP_TEST_SCENARIO"] = name;
    if (options.launcher_env) {
      env["RANK"] = std::to_string(r);
      env["LOCAL_RANK"] = std::to_string(r);
      env["WORLD_SIZE"] = std::to_string(world);
      env["LOCAL_WORLD_SIZE"] = std::to_string(world);
      env["DDP_RENDEZVOUS_DIR"] = rdzv.path();
      env["OMP_NUM_THREADS"] = "1";
    }
    for (const auto& kv : options.env) env[kv.first] = substitute(kv.second, r);
    std::vector<std::string> env_strings;
    for (const auto& kv : env) env_strings.push_back(kv.first + "=" + kv.second);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> arg_strings{"/proc/self/exe"};
    for (const auto& a : options.args) arg_strings.push_back(a);
    std::vector<char*> argv;
    for (auto& s : arg_strings) argv.push_back(s.data());
    argv.push_back(nullptr);

    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    pid_t pid = -1;
    if (fork_server::available() && options.args.empty()) {
      pid = fork_server::spawn(env_strings, pipefd[1]);
    }
    children[r].from_server = pid > 0;
    if (pid <= 0) {
      char exe[4096];
      const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
      if (n <= 0) throw std::runtime_error("readlink /proc/self/exe failed");
      exe[n] = '\0';
      pid = ::fork();
      if (pid == 0) {
        ::dup2(pipefd[1], 1);
        ::dup2(pipefd[1], 2);
        ::setpgid(0, 0);
        ::execve(exe, argv.data(), envp.data());
        ::_exit(127);
      }
    }
    ::close(pipefd[1]);
    children[r].pid = pid;
    children[r].fd = pipefd[0];
    children[r].result.rank = r;
  }

  // Drain every child's output until all pipes close or the deadline passes.
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  bool killed = false;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<int> idx;
    for (int r = 0; r < world; ++r) {
      if (children[r].fd >= 0) {
        fds.push_back({children[r].fd, POLLIN, 0});
        idx.push_back(r);
      }
    }
    if (fds.empty()) break;
    if (std::chrono::steady_clock::now() > deadline && !killed) {
      for (auto& c : children) ::kill(-c.pid, SIGKILL);
      killed = true;
    }
    ::poll(fds.data(), fds.size(), 100);
    for (size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        children[idx[i]].result.output.append(buf, static_cast<size_t>(n));
      } else {
        ::close(fds[i].fd);
        children[idx[i]].fd = -1;
      }
    }
  }
  std::vector<ProcessResult> results;
  for (auto& c : children) {
    int status = 0;
    if (c.from_server) {
      status = fork_server::wait(c.pid);
    } else {
      ::waitpid(c.pid, &status, 0);
    }
    ::kill(-c.pid, SIGKILL);  // anything the child left in its group
    c.result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (killed) c.result.output += "\n[harness: killed after the timeout]\n";
    results.push_back(c.result);
  }
  return results;
}

void expect_all_ok(const std::vector<ProcessResult>& results) {
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << "rank " << r.rank << " output:\n" << r.output;
  }
}

int run_command(const std::string& command, std::string* output) {
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) {
    if (output) output->append(buf, n);
  }
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

namespace {
std::map<std::string, Scenario>& registry() {
  static std::map<std::string, Scenario> r;
  return r;
}
}  // namespace

bool register_scenario(const std::string& name, Scenario fn) {
  registry()[name] = std::move(fn);
  return true;
}

bool maybe_run_scenario(int* exit_code) {
  const char* name = std::getenv("DDP_TEST_SCENARIO");
  if (name == nullptr || *name == '\0') return false;
  auto it = registry().find(name);
  if (it == registry().end()) {
    std::fprintf(stderr, "unknown scenario '%s'\n", name);
    *exit_code = 2;
    return true;
  }
  try {
    *exit_code = it->second();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scenario %s failed: %s\n", name, e.what());
    *exit_code = 1;
  }
  return true;
}

const char* source_dir() { return DDP_TEST_SOURCE_DIR; }
const char* binary_dir() { return DDP_TEST_BINARY_DIR; }

}  // namespace ddp_test
