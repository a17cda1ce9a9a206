#include "formats/atomic_file.h"
#include "distributed/common/check.h"

#include <c10/util/Exception.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ddp {
namespace detail {

// Note [Atomic write]
// POSIX rename() replaces a file atomically, but only what reached the disk survives a
// power cut. So: write a temporary file in the same directory (rename cannot cross file
// systems), fsync it (its bytes are on disk), rename it over the target (readers see
// the old file or the new one, never a mix), then fsync the directory (the rename
// itself is on disk). A crash before the rename leaves the old file and a stray
// temporary, which the next checkpoint save removes.

namespace {

std::string system_error(const char* what, const std::string& path) {
  return std::string(what) + " '" + path + "' failed: " + std::strerror(errno);
}

void fsync_directory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DDP_CHECK(fd >= 0, system_error("opening directory", directory));
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  DDP_CHECK(rc == 0, system_error("fsync of directory", directory));
}

std::string temporary_name(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  const std::string dir = parent_directory(path);
  const auto slash = path.find_last_of('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return dir + "/." + base + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

}  // namespace

std::string parent_directory(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = temporary_name(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  DDP_CHECK(fd >= 0, system_error("creating", tmp),
            ". Check that the directory exists and is writable.");
  auto fail = [&](const char* what, const std::string& name) {
    const std::string msg = system_error(what, name);
    ::close(fd);
    ::unlink(tmp.c_str());
    DDP_CHECK(false, msg);
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing", tmp);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync of", tmp);
  if (::close(fd) != 0) {
    const std::string msg = system_error("closing", tmp);
    ::unlink(tmp.c_str());
    DDP_CHECK(false, msg);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string msg = system_error("renaming to", path);
    ::unlink(tmp.c_str());
    DDP_CHECK(false, msg);
  }
  fsync_directory(parent_directory(path));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DDP_CHECK(in.good(), system_error("opening", path));
  std::ostringstream out;
  out << in.rdbuf();
  DDP_CHECK(!in.bad(), system_error("reading", path));
  return out.str();
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  if (!S_ISDIR(st.st_mode)) return ::unlink(path.c_str()) == 0 || errno == ENOENT;
  bool ok = true;
  for (const std::string& name : list_directory(path)) ok = remove_tree(path + "/" + name) && ok;
  return (::rmdir(path.c_str()) == 0 || errno == ENOENT) && ok;
}

void make_directories(const std::string& directory) {
  DDP_CHECK(!directory.empty(), "the checkpoint directory is empty; expected a path");
  std::string partial;
  std::stringstream parts(directory);
  std::string part;
  if (directory[0] == '/') partial = "/";
  while (std::getline(parts, part, '/')) {
    if (part.empty()) continue;
    partial += part;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      DDP_CHECK(false, system_error("creating directory", partial));
    }
    struct stat st {};
    DDP_CHECK(::stat(partial.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "'", partial,
              "' exists but is not a directory; expected a directory for "
              "checkpoints");
    partial += "/";
  }
}

std::vector<std::string> list_directory(const std::string& directory) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(directory.c_str());
  if (dir == nullptr) return names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  return names;
}

bool remove_file(const std::string& path) { return ::unlink(path.c_str()) == 0 || errno == ENOENT; }

}  // namespace detail
}  // namespace ddp
