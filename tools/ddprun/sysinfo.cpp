#include "sysinfo.h"

#include "options.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <fstream>
#include <sstream>

namespace ddprun {

int online_cpu_count() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int affinity_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return online_cpu_count();
}

int gpu_count() {
  int nodes = 0;
  glob_t g;
  if (glob("/dev/nvidia[0-9]*", 0, nullptr, &g) == 0) nodes = static_cast<int>(g.gl_pathc);
  globfree(&g);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!visible) return nodes;
  // CUDA stops at the first invalid entry, and "-1" is the usual way to hide all.
  int listed = 0;
  std::stringstream ss(visible);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty() || item[0] == '-') break;
    ++listed;
  }
  return nodes > 0 && nodes < listed ? nodes : listed;
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::string random_hex_id(int bytes) {
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < bytes; ++i) {
    unsigned v = rd() & 0xff;
    out += hex[v >> 4];
    out += hex[v & 15];
  }
  return out;
}

int pick_free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

static bool is_runnable(const std::string& path, int& err) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    err = errno;
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    err = EISDIR;
    return false;
  }
  if (access(path.c_str(), X_OK) != 0) {
    err = errno;
    return false;
  }
  return true;
}

std::string find_program(const std::string& program, std::string& why, int& exit_code) {
  int err = ENOENT;
  if (program.empty()) {
    why = "the program name is empty";
    exit_code = kExitNotFound;
    return "";
  }
  if (program.find('/') != std::string::npos) {
    if (is_runnable(program, err)) return program;
    exit_code = err == ENOENT || err == ENOTDIR ? kExitNotFound : kExitNotExecutable;
    why = "'" + program + "': " + std::strerror(err);
    return "";
  }
  const char* env_path = std::getenv("PATH");
  std::string path = env_path ? env_path : "/bin:/usr/bin";
  bool denied = false;
  std::string denied_path;
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (is_runnable(candidate, err)) return candidate;
    if (err == EACCES && !denied) {
      denied = true;
      denied_path = candidate;
    }
  }
  if (denied) {
    exit_code = kExitNotExecutable;
    why = "'" + denied_path + "' is not executable (permission denied)";
  } else {
    exit_code = kExitNotFound;
    why = "'" + program + "' was not found in PATH (" + path + ")";
  }
  return "";
}

static int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  ::remove(path);
  return 0;
}

void remove_tree(const std::string& path) {
  if (!path.empty()) nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

namespace {

// Whether `path` is a whole flight-recorder dump without a single collective (a rank
// that stopped before its first one writes such a dump at shutdown): nothing to line up.
// A dump cut short, or anything else, counts as having something.
bool records_nothing(const std::string& path) {
  std::ifstream in(path);
  std::string text(4096, '\0');
  in.read(&text[0], static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  const std::string key = "\"entries\": [";
  const size_t at = text.find(key);
  if (at == std::string::npos) return false;
  const size_t next = text.find_first_not_of(" \t\r\n", at + key.size());
  return next != std::string::npos && text.compare(next, 2, "]}") == 0 &&
         text.find_first_not_of(" \t\r\n", next + 2) == std::string::npos;
}

}  // namespace

std::vector<std::string> flight_recorder_files(const std::string& dir) {
  std::vector<std::pair<int, std::string>> found;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return {};
  const std::string prefix = "flight_recorder.rank", suffix = ".json";
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() + suffix.size() ||
        name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string rank =
        name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (rank.empty() || rank.find_first_not_of("0123456789") != std::string::npos) continue;
    if (records_nothing(dir + "/" + name)) continue;
    found.emplace_back(std::stoi(rank), dir + "/" + name);
  }
  closedir(d);
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

bool make_dirs(const std::string& path, int mode) {
  std::string partial;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') partial = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    partial += part;
    if (mkdir(partial.c_str(), mode) != 0 && errno != EEXIST) return false;
    partial += "/";
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return false;
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return false;
  }
  return true;
}

double now_seconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

}  // namespace ddprun

namespace ddprun {

std::string shell_quoted(int argc, char** argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) {
    const std::string word = argv[i];
    const bool plain = !word.empty() &&
                       word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_-+=/.,:@%") == std::string::npos;
    if (i) line += ' ';
    if (plain) {
      line += word;
      continue;
    }
    line += '\'';
    for (char c : word) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += '\'';
  }
  return line;
}

}  // namespace ddprun
