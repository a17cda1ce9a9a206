#include "distributed/shm/shm_transport.h"

#include "distributed/shm/shm_direct.h"  // SpanMap, destroyed with the Transport
#include "distributed/shm/shm_internal.h"
#include "distributed/shm/shm_layout.h"

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <new>
#include <random>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ddp {
namespace detail {
namespace shm {

std::string Transport::unique_name() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[80];
  std::snprintf(buf, sizeof(buf), "/ddp-%u-%d-%016llx", static_cast<unsigned>(::getuid()),
                static_cast<int>(::getpid()), static_cast<unsigned long long>(r));
  return buf;
}

Transport::Transport(std::string name, const Options& options, void* base, size_t bytes)
    : name_(std::move(name)),
      options_(options),
      base_(base),
      bytes_(bytes),
      peer_pids_(static_cast<size_t>(options.world_size), 0),
      local_abort_(std::make_unique<std::atomic<bool>>(false)) {
  options_.slice_bytes = rounded_slice(options.slice_bytes);
  inputs_.resize(static_cast<size_t>(options.world_size));
}

Transport::~Transport() {
  unlink();
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

namespace {

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

struct NewSegment {
  void* base = nullptr;
  int fd = -1;        // rank 0's descriptor of a memfd, until every rank has mapped it
  std::string where;  // what the other ranks pass to map_segment
};

// Note [Segments without a name]
// A segment made with shm_open has a name in /dev/shm from its creation until rank 0
// unlinks it, once every rank has mapped it. A rank 0 killed in between (while it waits
// for the others, which can take as long as the slowest rank needs to reach DDP's
// constructor) would leave it there. So rank 0 makes an anonymous memfd instead, which
// never has a name: the other ranks open it through /proc/<pid>/fd/<fd> of rank 0, which
// the kernel allows only to processes of the same user (the ptrace access check), and
// only while rank 0 holds that descriptor. Rank 0 closes it once every rank has mapped
// the memory; the memory goes with the last mapping, whatever kills whom. Ranks in
// another pid namespace cannot reach rank 0's /proc entry: for them the segment is named
// (`named`), as before. The inode in the locator guards against a reused pid.

// A new segment of `bytes` bytes, private to this user (0600), every page reserved,
// mapped. Throws Error(kSetup).
NewSegment map_new_segment(const std::string& name, size_t bytes, bool named) {
  int fd = -1;
  if (!named) {
    fd = static_cast<int>(::syscall(SYS_memfd_create, name.c_str() + 1, MFD_CLOEXEC));
    if (fd < 0 && errno != ENOSYS) {
      const int err = errno;
      throw Error(Error::Kind::kSetup,
                  "could not create shared memory (memfd " + name + "): " + errno_text(err));
    }
    named = fd < 0;  // a kernel without memfd_create (before 3.17)
  }
  if (named) {
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      const int err = errno;
      throw Error(Error::Kind::kSetup,
                  "could not create the shared memory segment " + name + ": " + errno_text(err));
    }
  }
  auto give_up = [&](const std::string& why) {
    ::close(fd);
    if (named) ::shm_unlink(name.c_str());
    throw Error(Error::Kind::kSetup, why);
  };
  ::fchmod(fd, 0600);  // whatever the umask: private to this user
  // Reserve every page now: a /dev/shm too small for the segment (Docker's default is
  // 64 MiB) or a memory limit fails here with a message, instead of a SIGBUS at the
  // first touch.
  if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    std::string where_text = " (" + errno_text(err) + ")";
    if (named) {
      struct statvfs vfs {};
      if (::statvfs("/dev/shm", &vfs) == 0) {
        where_text +=
            ", and /dev/shm has " + mib(static_cast<size_t>(vfs.f_bavail) * vfs.f_frsize) + " free";
      }
      where_text += ". Enlarge /dev/shm (in Docker: --shm-size=1g), or use backend \"gloo\".";
    } else {
      where_text += ": this machine or container is short of memory. Free some, or use "
                    "backend \"gloo\".";
    }
    give_up("could not reserve " + mib(bytes) + " for the shared memory segment " + name +
            where_text);
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) give_up("could not map " + name + ": " + errno_text(errno));
  NewSegment made;
  made.base = base;
  if (named) {
    ::close(fd);
    made.where = name;
  } else {
    struct stat st {};
    ::fstat(fd, &st);
    made.fd = fd;
    made.where = "fd:" + std::to_string(::getpid()) + ":" + std::to_string(fd) + ":" +
                 std::to_string(static_cast<unsigned long long>(st.st_ino));
  }
  return made;
}

// Maps the segment that rank 0 made, reached through `where` (NewSegment::where), which
// must have `bytes` bytes (`why_size`: what a different size means). Throws Error(kSetup).
void* map_segment(const std::string& where, size_t bytes, const std::string& why_size) {
  int fd = -1;
  unsigned long long want_ino = 0;
  int pid = 0;
  int their_fd = -1;
  const bool by_fd = std::sscanf(where.c_str(), "fd:%d:%d:%llu", &pid, &their_fd, &want_ino) == 3;
  if (by_fd) {
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(their_fd);
    fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      throw Error(Error::Kind::kSetup,
                  "could not open the shared memory that rank 0 (pid " + std::to_string(pid) +
                      ") created, through " + path + ": " + errno_text(err) +
                      (err == ENOENT ? ". Rank 0 has exited, or closed it after a failure."
                                     : ". The ranks must share one host and run as one user."));
    }
  } else {
    fd = ::shm_open(where.c_str(), O_RDWR, 0);
    if (fd < 0) {
      const int err = errno;
      throw Error(Error::Kind::kSetup,
                  "could not open the shared memory segment " + where +
                      " that rank 0 created: " + errno_text(err) +
                      ". The ranks must share one host and one /dev/shm (and one user).");
    }
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || (by_fd && static_cast<unsigned long long>(st.st_ino) != want_ino)) {
    ::close(fd);
    throw Error(Error::Kind::kSetup, "the shared memory that rank 0 (pid " + std::to_string(pid) +
                                         ") created is gone: that process has exited.");
  }
  if (static_cast<size_t>(st.st_size) != bytes) {
    ::close(fd);
    throw Error(Error::Kind::kSetup,
                "the shared memory segment " + where + " has " + std::to_string(st.st_size) +
                    " bytes, but this rank expects " + std::to_string(bytes) + ": " + why_size);
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    throw Error(Error::Kind::kSetup, "could not map " + where + ": " + errno_text(err));
  }
  return base;
}

// Rank 0, once every rank has mapped a segment: closes the memfd they opened it through,
// or removes its name from /dev/shm. Idempotent.
void close_way_in(int* fd, bool* linked, const std::string& name) {
  if (*fd >= 0) {
    ::close(*fd);
    *fd = -1;
  }
  if (*linked) {
    ::shm_unlink(name.c_str());
    *linked = false;
  }
}

}  // namespace

std::unique_ptr<Transport> Transport::create(const std::string& name, const Options& options,
                                             bool named) {
  const size_t bytes = segment_bytes(options);
  NewSegment made = map_new_segment(name, bytes, named);
  std::unique_ptr<Transport> t(new Transport(name, options, made.base, bytes));
  t->fd_ = made.fd;
  t->where_ = made.where;
  t->linked_ = made.fd < 0;
  t->init_header();
  return t;
}

std::unique_ptr<Transport> Transport::open(const std::string& where, const Options& options) {
  const size_t bytes = segment_bytes(options);
  void* base =
      map_segment(where, bytes,
                  "the ranks disagree on the world size or the slice size (DDP_SHM_SLICE_BYTES).");
  std::unique_ptr<Transport> t(new Transport(where, options, base, bytes));
  t->where_ = where;
  const auto* h = static_cast<const Header*>(base);
  if (h->magic != kMagic || h->world_size != static_cast<uint32_t>(options.world_size)) {
    throw Error(Error::Kind::kSetup, "the shared memory segment " + where +
                                         " was not made by this version for " +
                                         std::to_string(options.world_size) + " ranks.");
  }
  return t;
}

SharedPool::SharedPool(std::string name, void* base, size_t bytes, size_t bytes_per_rank,
                       uint32_t id)
    : name_(std::move(name)),
      base_(base),
      bytes_(bytes),
      bytes_per_rank_(bytes_per_rank),
      id_(id) {}

SharedPool::~SharedPool() {
  unlink();
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

void SharedPool::unlink() { close_way_in(&fd_, &linked_, name_); }

std::shared_ptr<SharedPool> SharedPool::create(const std::string& name, int world_size,
                                               size_t bytes_per_rank, uint32_t id, bool named) {
  const size_t bytes = static_cast<size_t>(world_size) * bytes_per_rank;
  NewSegment made = map_new_segment(name, bytes, named);
  std::shared_ptr<SharedPool> pool(new SharedPool(name, made.base, bytes, bytes_per_rank, id));
  pool->fd_ = made.fd;
  pool->where_ = made.where;
  pool->linked_ = made.fd < 0;
  return pool;
}

std::shared_ptr<SharedPool> SharedPool::open(const std::string& where, int world_size,
                                             size_t bytes_per_rank, uint32_t id) {
  const size_t bytes = static_cast<size_t>(world_size) * bytes_per_rank;
  void* base = map_segment(where, bytes,
                           "the ranks asked for buffers of different sizes (DDP must be "
                           "constructed with the same model on every rank).");
  std::shared_ptr<SharedPool> pool(new SharedPool(where, base, bytes, bytes_per_rank, id));
  pool->where_ = where;
  return pool;
}

void Transport::init_header() {
  auto* h = new (base_) Header;
  h->magic = kMagic;
  h->world_size = static_cast<uint32_t>(options_.world_size);
  h->reserved = 0;
  h->slice_bytes = options_.slice_bytes;
  h->total_bytes = bytes_;
  h->abort.store(0, std::memory_order_relaxed);
  for (int r = 0; r < options_.world_size; ++r) {
    auto* c =
        new (static_cast<unsigned char*>(base_) + kLine * (1 + static_cast<size_t>(r))) Control;
    c->seq.store(0, std::memory_order_relaxed);
    c->waiters.store(0, std::memory_order_relaxed);
    for (int s = 0; s < 2; ++s) {
      c->call[s].store(0, std::memory_order_relaxed);
      c->bytes[s].store(0, std::memory_order_relaxed);
      c->offset[s].store(0, std::memory_order_relaxed);
    }
  }
  // Published to the other ranks through the store: they map the segment only after
  // reading its name, which rank 0 writes after this (a system call on both sides).
}

void Transport::unlink() { close_way_in(&fd_, &linked_, name_); }

}  // namespace shm
}  // namespace detail
}  // namespace ddp
