#include "distributed/shm/shm_transport.h"

#include "distributed/shm/shm_direct.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <sstream>
#include <type_traits>

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ddp {
namespace detail {
namespace shm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x33306d6873706464ull;  // "ddpshm03"
constexpr size_t kPage = 4096;
constexpr size_t kLine = 64;
// How long a wait spins before it sleeps in the kernel: long enough to catch a peer
// that is a few microseconds behind, short enough not to take a core from backward.
constexpr auto kSpin = std::chrono::microseconds(30);
// The longest single sleep: deadlines, aborts and dead peers are noticed this often.
constexpr auto kNap = std::chrono::milliseconds(20);
// How often a waiting rank asks whether its peer's process still exists.
constexpr auto kLivenessEvery = std::chrono::milliseconds(100);

// Shared by every rank. Only std::atomic members are written after creation.
struct alignas(kLine) Header {
  uint64_t magic;
  uint32_t world_size;
  uint32_t reserved;
  uint64_t slice_bytes;
  uint64_t total_bytes;
  // 0, or who failed first and why (abort_word below): set once, by compare-exchange.
  std::atomic<uint64_t> abort;
};

struct alignas(kLine) Control {
  std::atomic<uint32_t> seq;      // phases this rank has published
  std::atomic<uint32_t> waiters;  // peers asleep on seq
  // The collective whose first slice is in slot s: kind, dtype, op and root, and its
  // size. Per slot, because a rank that finished a barrier may already describe its next
  // collective while a peer still checks the barrier's.
  std::atomic<uint64_t> call[2];
  std::atomic<uint64_t> bytes[2];
  std::atomic<uint64_t> offset[2];  // all_reduce_in_pool: where in the pool
};

static_assert(sizeof(Header) <= kLine && sizeof(Control) == kLine, "one cache line each");
static_assert(std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free (address-free across processes)");

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// header | control block per rank | direct area per rank | slots
size_t direct_areas_offset(int world_size) {
  return round_up(kLine + kLine * static_cast<size_t>(world_size), kPage);
}

size_t direct_area_bytes() { return round_up(kLine + kMaxSpans * sizeof(SpanEntry), kPage); }

size_t data_offset(int world_size) {
  return direct_areas_offset(world_size) + static_cast<size_t>(world_size) * direct_area_bytes();
}

size_t rounded_slice(size_t slice_bytes) {
  return round_up(std::max<size_t>(slice_bytes, 1), kPage);
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Futexes on a MAP_SHARED mapping: the non-private operations, which key on the page.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool reached(uint32_t seq, uint32_t target) { return static_cast<int32_t>(seq - target) >= 0; }

// Whether process `pid` is gone: no such process, or a zombie not yet reaped.
bool process_gone(int64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() &&
         (text[paren + 2] == 'Z' || text[paren + 2] == 'X');
}

std::string errno_text(int err) { return std::strerror(err); }

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// ---- Reduction kernels ---------------------------------------------------------------
//
// float16 and bfloat16 are reduced in float32 and rounded once (round to nearest even),
// with the conversions of the FP16 library (as in c10).

float bits_to_float(uint32_t w) {
  float f;
  std::memcpy(&f, &w, sizeof(f));
  return f;
}

uint32_t float_to_bits(float f) {
  uint32_t w;
  std::memcpy(&w, &f, sizeof(w));
  return w;
}

struct Half {
  using Acc = float;
  static float load(uint16_t h) {
    const uint32_t w = static_cast<uint32_t>(h) << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = bits_to_float((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = bits_to_float((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t result =
        sign | (two_w < (1u << 27) ? float_to_bits(denormalized) : float_to_bits(normalized));
    return bits_to_float(result);
  }
  static uint16_t store(float f) {
    float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = float_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = bits_to_float((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = float_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
  }
};

struct BFloat16 {
  using Acc = float;
  static float load(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }
  static uint16_t store(float f) {
    if (std::isnan(f)) return 0x7FC0;
    const uint32_t u = float_to_bits(f);
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
};

template <typename T>
struct Same {
  using Acc = T;
  static T load(T v) { return v; }
  static T store(T v) { return v; }
};

template <typename T>
T sum(T a, T b) {
  if constexpr (std::is_integral_v<T>) {  // wraps, as two's complement hardware does
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
// NaN wins, as in torch.maximum / torch.minimum.
template <typename T>
T max_of(T a, T b) {
  return (a > b || a != a) ? a : b;
}
template <typename T>
T min_of(T a, T b) {
  return (a < b || a != a) ? a : b;
}

// out[i] = in[0][i] (+) in[1][i] (+) ... (+) in[n-1][i], in that order, for i in
// [begin, end), and the same into copies[0..num_copies)[i]. Accumulates a block at a
// time in a local array that stays in L1, so each pass is a plain loop the compiler
// vectorizes. out or a copy may be one of the inputs: a block is read whole before it
// is written.
template <typename T, typename Cv, typename F>
void reduce_range(void* out_v, void* const* copies, int num_copies, const void* const* in_v, int n,
                  size_t begin, size_t end, F f) {
  using Acc = typename Cv::Acc;
  constexpr size_t kBlock = 1024;
  Acc acc[kBlock];
  T* out = static_cast<T*>(out_v);
  for (size_t b = begin; b < end; b += kBlock) {
    const size_t m = std::min(kBlock, end - b);
    const T* s0 = static_cast<const T*>(in_v[0]) + b;
    for (size_t i = 0; i < m; ++i) acc[i] = Cv::load(s0[i]);
    for (int k = 1; k < n; ++k) {
      const T* s = static_cast<const T*>(in_v[k]) + b;
      for (size_t i = 0; i < m; ++i) acc[i] = f(acc[i], Cv::load(s[i]));
    }
    for (size_t i = 0; i < m; ++i) out[b + i] = Cv::store(acc[i]);
    for (int c = 0; c < num_copies; ++c) {
      std::memcpy(static_cast<T*>(copies[c]) + b, out + b, m * sizeof(T));
    }
  }
}

template <typename T, typename Cv>
void reduce_typed(Op op, void* out, void* const* copies, int num_copies, const void* const* in,
                  int n, size_t begin, size_t end) {
  using Acc = typename Cv::Acc;
  switch (op) {
    case Op::kSum:
      return reduce_range<T, Cv>(out, copies, num_copies, in, n, begin, end,
                                 [](Acc a, Acc b) { return sum(a, b); });
    case Op::kMax:
      return reduce_range<T, Cv>(out, copies, num_copies, in, n, begin, end,
                                 [](Acc a, Acc b) { return max_of(a, b); });
    case Op::kMin:
      return reduce_range<T, Cv>(out, copies, num_copies, in, n, begin, end,
                                 [](Acc a, Acc b) { return min_of(a, b); });
  }
}

void reduce(DType dtype, Op op, void* out, void* const* copies, int num_copies,
            const void* const* in, int n, size_t begin, size_t end) {
  switch (dtype) {
    case DType::kFloat32:
      return reduce_typed<float, Same<float>>(op, out, copies, num_copies, in, n, begin, end);
    case DType::kFloat64:
      return reduce_typed<double, Same<double>>(op, out, copies, num_copies, in, n, begin, end);
    case DType::kFloat16:
      return reduce_typed<uint16_t, Half>(op, out, copies, num_copies, in, n, begin, end);
    case DType::kBFloat16:
      return reduce_typed<uint16_t, BFloat16>(op, out, copies, num_copies, in, n, begin, end);
    case DType::kInt32:
      return reduce_typed<int32_t, Same<int32_t>>(op, out, copies, num_copies, in, n, begin, end);
    case DType::kInt64:
      return reduce_typed<int64_t, Same<int64_t>>(op, out, copies, num_copies, in, n, begin, end);
  }
}

enum class Kind : uint8_t {
  kAllReduce = 1,
  kBroadcast,
  kAllGather,
  kBarrier,
  kAllReduceInPool,
  kAllReduceDirect
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kBarrier:
      return "barrier";
    case Kind::kAllReduceInPool:
      return "all_reduce of a shared buffer";
    case Kind::kAllReduceDirect:
      return "all_reduce of private buffers";
  }
  return "?";
}

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  return 1;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "?";
}

const char* op_name(Op op) {
  switch (op) {
    case Op::kSum:
      return "SUM";
    case Op::kMax:
      return "MAX";
    case Op::kMin:
      return "MIN";
  }
  return "?";
}

struct Transport::Call {
  Kind kind = Kind::kBarrier;
  DType dtype = DType::kFloat32;
  Op op = Op::kSum;
  int root = 0;
  size_t bytes = 0;   // per rank
  size_t offset = 0;  // kAllReduceInPool: into each rank's part of the pool
  const SharedPool* pool = nullptr;
  void* data = nullptr;
  const void* input = nullptr;
  const std::vector<void*>* outputs = nullptr;

  static Call reduction(Kind kind, size_t count, DType dtype, Op op) {
    Call call;
    call.kind = kind;
    call.dtype = dtype;
    call.op = op;
    call.bytes = count * dtype_size(dtype);
    return call;
  }

  // kAllReduceInPool: the pool's id where the root goes.
  uint64_t code() const {
    const uint32_t high = kind == Kind::kAllReduceInPool ? pool->id() : static_cast<uint32_t>(root);
    return static_cast<uint64_t>(kind) | static_cast<uint64_t>(dtype) << 8 |
           static_cast<uint64_t>(op) << 16 | static_cast<uint64_t>(high) << 32;
  }
  static std::string describe(uint64_t code, uint64_t bytes, uint64_t offset = 0) {
    const auto kind = static_cast<Kind>(code & 0xFF);
    std::ostringstream os;
    os << kind_name(kind);
    if (kind == Kind::kAllReduce || kind == Kind::kAllReduceDirect) {
      os << " (" << dtype_name(static_cast<DType>((code >> 8) & 0xFF)) << ", "
         << op_name(static_cast<Op>((code >> 16) & 0xFF)) << ", " << bytes << " bytes)";
    } else if (kind == Kind::kAllReduceInPool) {
      os << " (" << dtype_name(static_cast<DType>((code >> 8) & 0xFF)) << ", "
         << op_name(static_cast<Op>((code >> 16) & 0xFF)) << ", " << bytes << " bytes at " << offset
         << " in pool " << (code >> 32) << ")";
    } else if (kind == Kind::kBroadcast) {
      os << " (from rank " << static_cast<int32_t>(code >> 32) << ", " << bytes << " bytes)";
    } else if (kind == Kind::kAllGather) {
      os << " (" << bytes << " bytes per rank)";
    }
    return os.str();
  }
};

size_t segment_bytes(const Options& o) {
  return data_offset(o.world_size) +
         2 * (static_cast<size_t>(o.world_size) + 1) * rounded_slice(o.slice_bytes);
}

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

void Transport::set_peer_pid(int peer, int64_t pid) {
  peer_pids_.at(static_cast<size_t>(peer)) = pid;
}

namespace {
Header& header_of(void* base) { return *static_cast<Header*>(base); }
Control& control_of(void* base, int rank) {
  return *reinterpret_cast<Control*>(static_cast<unsigned char*>(base) +
                                     kLine * (1 + static_cast<size_t>(rank)));
}
}  // namespace

unsigned char* Transport::input_area(int slot, int rank) const {
  const size_t n = static_cast<size_t>(options_.world_size);
  return static_cast<unsigned char*>(base_) + data_offset(options_.world_size) +
         (static_cast<size_t>(slot) * (n + 1) + static_cast<size_t>(rank)) * options_.slice_bytes;
}

unsigned char* Transport::result_area(int slot) const {
  return input_area(slot, options_.world_size);
}

namespace {

// The abort word: which rank failed first, how, and which peer it was waiting for.
uint64_t abort_word(int rank, Error::Kind kind, int peer) {
  return uint64_t(1) << 63 | static_cast<uint64_t>(kind) << 48 |
         static_cast<uint64_t>((peer + 1) & 0xFFFF) << 32 | static_cast<uint32_t>(rank);
}

}  // namespace

std::string Transport::abort_cause(uint64_t word) const {
  const int rank = static_cast<int>(word & 0xFFFFFFFFu);
  const auto kind = static_cast<Error::Kind>((word >> 48) & 0x7FFF);
  const int peer = static_cast<int>((word >> 32) & 0xFFFF) - 1;
  const std::string who = "rank " + std::to_string(rank);
  const std::string p = "rank " + std::to_string(peer);
  switch (kind) {
    case Error::Kind::kPeerGone: {
      const int64_t pid = peer >= 0 ? peer_pids_[static_cast<size_t>(peer)] : 0;
      return p + (pid > 0 ? " (pid " + std::to_string(pid) + ")" : std::string()) +
             " has exited (seen by " + who + ")";
    }
    case Error::Kind::kTimeout:
      return who + " gave up waiting for " + p + " at its deadline";
    case Error::Kind::kMismatch:
      return who + " found that the ranks called different collectives";
    case Error::Kind::kSetup:
      return who + " could not read or write the memory of " + p;
    default:
      return who + " was shut down with a collective in flight";
  }
}

void Transport::abort(bool local_only) { raise_abort(Error::Kind::kAborted, -1, local_only); }

void Transport::raise_abort(Error::Kind kind, int peer, bool local_only) {
  local_abort_->store(true, std::memory_order_release);
  if (!local_only) {
    uint64_t none = 0;
    header_of(base_).abort.compare_exchange_strong(none, abort_word(options_.rank, kind, peer),
                                                   std::memory_order_acq_rel);
  }
  for (int r = 0; r < options_.world_size; ++r) futex_wake_all(&control_of(base_, r).seq);
}

void Transport::check_stopped(const Call& call, int waiting_for) {
  if (const uint64_t aborted = header_of(base_).abort.load(std::memory_order_acquire)) {
    fail_stopped(aborted, call);
  }
  if (local_abort_->load(std::memory_order_acquire)) {
    fail(Error::Kind::kAborted,
         "this process group was shut down while " + Call::describe(call.code(), call.bytes) +
             (waiting_for >= 0 ? " was still waiting for rank " + std::to_string(waiting_for)
                               : std::string(" was in flight")));
  }
}

void Transport::fail_stopped(uint64_t word, const Call& call) {
  // A peer that gave up at its deadline stops this rank's call for the same reason: the
  // rank it waited for did not come in time, which is a timeout here too.
  const auto kind = static_cast<Error::Kind>((word >> 48) & 0x7FFF);
  if (kind == Error::Kind::kTimeout) {
    fail(Error::Kind::kTimeout, Call::describe(call.code(), call.bytes) +
                                    " timed out: " + abort_cause(word) + "; the group is broken");
  }
  fail(Error::Kind::kAborted, "the group was stopped while this rank was in " +
                                  Call::describe(call.code(), call.bytes) + ": " +
                                  abort_cause(word) + "; the group is broken");
}

void Transport::fail(Error::Kind kind, const std::string& message, int peer) {
  // Stop the peers too, unless this failure is already their doing.
  if (kind != Error::Kind::kAborted) raise_abort(kind, peer, /*local_only=*/false);
  throw Error(kind, message);
}

void Transport::publish() {
  Control& c = control_of(base_, options_.rank);
  ++step_;
  // seq_cst store then seq_cst load of waiters, against the waiter's seq_cst increment
  // of waiters then load of seq: one of the two sees the other, so no wake-up is lost.
  c.seq.store(step_, std::memory_order_seq_cst);
  if (c.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&c.seq);
}

void Transport::wait_one(int peer, uint32_t target, const Call& call, const char* phase) {
  Control& c = control_of(base_, peer);
  if (reached(c.seq.load(std::memory_order_acquire), target)) return;
  const auto spin_end = Clock::now() + kSpin;
  do {
    for (int i = 0; i < 64; ++i) {
      cpu_relax();
      if (reached(c.seq.load(std::memory_order_acquire), target)) return;
    }
  } while (Clock::now() < spin_end);

  auto next_liveness = Clock::now();
  for (;;) {
    const auto now = Clock::now();
    check_stopped(call, peer);
    if (now >= deadline_) {
      fail(Error::Kind::kTimeout,
           Call::describe(call.code(), call.bytes) + " timed out after " +
               std::to_string(options_.timeout.count()) + " ms waiting for rank " +
               std::to_string(peer) + " (phase " + phase + "): rank " + std::to_string(peer) +
               " did not take part in time. Check that every rank is alive and calls the same "
               "collectives in the same order, or raise the timeout",
           peer);
    }
    const int64_t pid = peer_pids_[static_cast<size_t>(peer)];
    if (pid > 0 && now >= next_liveness) {
      next_liveness = now + kLivenessEvery;
      if (process_gone(pid)) {
        fail(Error::Kind::kPeerGone,
             "rank " + std::to_string(peer) + " (pid " + std::to_string(pid) +
                 ") has exited while this rank was in " + Call::describe(call.code(), call.bytes) +
                 "; the group is broken",
             peer);
      }
    }
    c.waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = c.seq.load(std::memory_order_seq_cst);
    if (!reached(seen, target)) {
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline_ - now);
      futex_wait(&c.seq, seen,
                 std::min<std::chrono::nanoseconds>(kNap, std::max(left, std::chrono::nanoseconds(
                                                                             1000))));
    }
    c.waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(c.seq.load(std::memory_order_acquire), target)) return;
  }
}

void Transport::wait_all(uint32_t target, const Call& call, const char* phase) {
  for (int r = 0; r < options_.world_size; ++r) {
    if (r != options_.rank) wait_one(r, target, call, phase);
  }
}

void Transport::check_same_call(const Call& call, int slot) {
  const uint64_t code = call.code();
  for (int r = 0; r < options_.world_size; ++r) {
    if (r == options_.rank) continue;
    Control& c = control_of(base_, r);
    const uint64_t theirs = c.call[slot].load(std::memory_order_relaxed);
    const uint64_t their_bytes = c.bytes[slot].load(std::memory_order_relaxed);
    const uint64_t their_offset = c.offset[slot].load(std::memory_order_relaxed);
    if (theirs != code || their_bytes != call.bytes || their_offset != call.offset) {
      fail(Error::Kind::kMismatch,
           "the ranks called different collectives: this rank called " +
               Call::describe(code, call.bytes, call.offset) + ", but rank " + std::to_string(r) +
               " called " + Call::describe(theirs, their_bytes, their_offset) +
               ". Every rank must call the same collectives, in the same order, with the same "
               "sizes",
           r);
    }
  }
}

void Transport::begin_call() {
  deadline_ = Clock::now() + options_.timeout;
  if (const uint64_t aborted = header_of(base_).abort.load(std::memory_order_acquire)) {
    throw Error(Error::Kind::kAborted, "an earlier collective of this group failed: " +
                                           abort_cause(aborted) + "; the group is broken");
  }
  if (local_abort_->load(std::memory_order_acquire)) {
    throw Error(Error::Kind::kAborted, "this process group was shut down");
  }
}

// Note [Zero-copy buffers]: one unit of three phases, like a slice, so that the slot
// bookkeeping of run() holds across both kinds of collectives; the slot carries only the
// description of the call, no data.
void Transport::enter_unit(const Call& call) {
  begin_call();
  Control& mine = control_of(base_, options_.rank);
  const int slot = static_cast<int>(slices_ & 1);
  if (slices_ >= 2) wait_all(step_ - 3, call, "slot reuse");
  mine.call[slot].store(call.code(), std::memory_order_relaxed);
  mine.bytes[slot].store(call.bytes, std::memory_order_relaxed);
  mine.offset[slot].store(call.offset, std::memory_order_relaxed);
  // A: this rank's input is in place (its writes happen before this release).
  publish();
  wait_all(step_, call, "A");
  check_same_call(call, slot);
}

void Transport::leave_unit(const Call& call) {
  publish();  // B: this rank's partition is done
  // Every partition is in this rank's buffer once every rank has published B; after that
  // no rank touches another's buffer for this call.
  wait_all(step_, call, "B");
  publish();  // C
  ++slices_;
}

std::pair<size_t, size_t> Transport::partition(size_t elems, size_t esize) const {
  const size_t n = static_cast<size_t>(options_.world_size);
  const size_t line = std::max<size_t>(1, kLine / esize);  // partitions are whole lines
  const size_t chunk = round_up((elems + n - 1) / n, line);
  const size_t begin = std::min(elems, chunk * static_cast<size_t>(options_.rank));
  return {begin, std::min(elems, begin + chunk)};
}

void Transport::run_in_pool(const Call& call) {
  const int n = options_.world_size;
  const int me = options_.rank;
  const size_t esize = dtype_size(call.dtype);
  enter_unit(call);

  // B: partition `me` reduced over every rank's buffer, in rank order, into all of them.
  const auto [begin, end] = partition(call.bytes / esize, esize);
  if (begin < end) {
    copies_.clear();
    for (int r = 0; r < n; ++r) {
      inputs_[static_cast<size_t>(r)] = call.pool->part(r) + call.offset;
      if (r != me) copies_.push_back(call.pool->part(r) + call.offset);
    }
    reduce(call.dtype, call.op, call.pool->part(me) + call.offset, copies_.data(),
           static_cast<int>(copies_.size()), inputs_.data(), n, begin, end);
  }
  leave_unit(call);
}

void Transport::run(const Call& call) {
  const int n = options_.world_size;
  const int me = options_.rank;
  const size_t slice = options_.slice_bytes;
  const size_t esize = call.kind == Kind::kAllReduce ? dtype_size(call.dtype) : 1;
  // all_reduce slices hold whole elements; the partitions of a slice are whole cache lines.
  const size_t per_slice = call.kind == Kind::kAllReduce ? slice / esize * esize : slice;
  const size_t slices = std::max<size_t>(1, (call.bytes + per_slice - 1) / per_slice);
  begin_call();

  Control& mine = control_of(base_, me);
  for (size_t s = 0; s < slices; ++s, ++slices_) {
    const int slot = static_cast<int>(slices_ & 1);
    const size_t offset = s * per_slice;
    const size_t len = std::min(per_slice, call.bytes - std::min(call.bytes, offset));
    // The slot is free once every rank has copied out the slice that used it last.
    if (slices_ >= 2) wait_all(step_ - 3, call, "slot reuse");

    // A: this rank's bytes in.
    if (s == 0) {
      mine.call[slot].store(call.code(), std::memory_order_relaxed);
      mine.bytes[slot].store(call.bytes, std::memory_order_relaxed);
      mine.offset[slot].store(0, std::memory_order_relaxed);
    }
    unsigned char* my_in = input_area(slot, me);
    unsigned char* my_data =
        call.data != nullptr ? static_cast<unsigned char*>(call.data) + offset : nullptr;
    // all_reduce: this rank's partition of the slice, [part_begin, part_end) in elements.
    // Partitions are whole cache lines.
    size_t part_begin = 0, part_end = 0;
    if (call.kind == Kind::kAllReduce)
      std::tie(part_begin, part_end) = partition(len / esize, esize);
    if (call.kind == Kind::kAllReduce) {
      // Only what the peers reduce: this rank reads its own partition from its own buffer.
      std::memcpy(my_in, my_data, part_begin * esize);
      std::memcpy(my_in + part_end * esize, my_data + part_end * esize, len - part_end * esize);
    } else if (call.kind == Kind::kBroadcast && me == call.root) {
      std::memcpy(my_in, static_cast<const unsigned char*>(call.data) + offset, len);
    } else if (call.kind == Kind::kAllGather) {
      std::memcpy(my_in, static_cast<const unsigned char*>(call.input) + offset, len);
    }
    publish();
    wait_all(step_, call, "A");
    if (s == 0) check_same_call(call, slot);

    // B: this rank's partition reduced, in rank order.
    // The result goes to the result area, for the peers, and straight into this rank's
    // own buffer.
    if (call.kind == Kind::kAllReduce) {
      if (part_begin < part_end) {
        for (int r = 0; r < n; ++r) {
          inputs_[static_cast<size_t>(r)] = r == me ? my_data : input_area(slot, r);
        }
        void* own = my_data;
        reduce(call.dtype, call.op, result_area(slot), &own, 1, inputs_.data(), n, part_begin,
               part_end);
      }
      publish();
      wait_all(step_, call, "B");
    } else {
      publish();
    }

    // C: the result out.
    if (call.kind == Kind::kAllReduce) {
      const unsigned char* result = result_area(slot);
      std::memcpy(my_data, result, part_begin * esize);
      std::memcpy(my_data + part_end * esize, result + part_end * esize, len - part_end * esize);
    } else if (call.kind == Kind::kBroadcast && me != call.root) {
      std::memcpy(static_cast<unsigned char*>(call.data) + offset, input_area(slot, call.root),
                  len);
    } else if (call.kind == Kind::kAllGather) {
      for (int r = 0; r < n; ++r) {
        std::memcpy(static_cast<unsigned char*>((*call.outputs)[static_cast<size_t>(r)]) + offset,
                    input_area(slot, r), len);
      }
    }
    publish();
  }
}

void Transport::all_reduce(void* data, size_t count, DType dtype, Op op) {
  Call call = Call::reduction(Kind::kAllReduce, count, dtype, op);
  call.data = data;
  run(call);
}

void Transport::all_reduce_in_pool(const SharedPool& pool, size_t offset, size_t count, DType dtype,
                                   Op op) {
  Call call = Call::reduction(Kind::kAllReduceInPool, count, dtype, op);
  call.offset = offset;
  call.pool = &pool;
  if (offset > pool.bytes_per_rank() || call.bytes > pool.bytes_per_rank() - offset) {
    throw std::invalid_argument("all_reduce_in_pool: " + std::to_string(call.bytes) +
                                " bytes at offset " + std::to_string(offset) +
                                " do not fit a pool part of " +
                                std::to_string(pool.bytes_per_rank()) + " bytes");
  }
  run_in_pool(call);
}

// ---- Note [Direct all-reduce] ---------------------------------------------------------

// A rank's part of the segment for direct all-reduces. Only its owner writes it, except
// `probe`, which its owner writes through a peer's address space (enable_direct).
struct Transport::DirectArea {
  int64_t pid;     // its owner's, as its own pid namespace numbers it
  uint64_t base;   // where its owner mapped the segment
  uint64_t nonce;  // random; a peer that reads it through `base` reached the right process
  std::atomic<uint64_t> probe;
  uint64_t num_spans;  // of the owner's current direct all-reduce
  double scale;        // of the owner's values in it
  uint64_t reserved[2];
  SpanEntry spans[kMaxSpans];
};
Transport::DirectArea& Transport::direct_area(int rank) const {
  static_assert(sizeof(SpanEntry) == 16 && sizeof(DirectArea) == kLine + kMaxSpans * 16,
                "a direct area is one line of header and then the spans");
  return *reinterpret_cast<DirectArea*>(static_cast<unsigned char*>(base_) +
                                        direct_areas_offset(options_.world_size) +
                                        static_cast<size_t>(rank) * direct_area_bytes());
}

bool Transport::enable_direct(bool wanted, std::string* why_not) {
  const int n = options_.world_size;
  const int me = options_.rank;
  DirectArea& mine = direct_area(me);
  std::random_device rd;
  mine.pid = static_cast<int64_t>(::getpid());
  mine.base = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(base_));
  mine.nonce = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) | 1;
  mine.probe.store(0, std::memory_order_relaxed);
  barrier();  // every area is filled in

  // Read each peer's nonce through its own address space, and only then (it is the right
  // process) write a token into this rank's area through it and read it back here.
  std::string reason = wanted ? "" : "turned off (DDP_SHM_CMA=0)";
  for (int k = 0; k < n && reason.empty(); ++k) {
    if (k == me) continue;
    const DirectArea& theirs = direct_area(k);
    const int64_t pid = peer_pids_[static_cast<size_t>(k)];
    const std::string who = "rank " + std::to_string(k) + " (pid " + std::to_string(pid) + ")";
    if (pid <= 0 || pid != theirs.pid) {
      reason = "rank " + std::to_string(k) + " is in another pid namespace";
      break;
    }
    // Where a field of rank `owner`'s area lies in rank k's address space.
    auto in_their_space = [&](int owner, size_t field) {
      return reinterpret_cast<void*>(
          static_cast<uintptr_t>(theirs.base + direct_areas_offset(n) +
                                 static_cast<size_t>(owner) * direct_area_bytes() + field));
    };
    uint64_t got = 0;
    iovec local{&got, sizeof(got)};
    iovec remote{in_their_space(k, offsetof(DirectArea, nonce)), sizeof(got)};
    if (const int err = read_from(static_cast<pid_t>(pid), &local, 1, &remote, 1, sizeof(got))) {
      reason = "process_vm_readv of " + who + " failed: " + errno_text(err) +
               (err == EPERM ? " (the kernel allows it only where ptrace is allowed: Yama's "
                               "ptrace_scope (sysctl kernel.yama.ptrace_scope=0 allows it), a "
                               "seccomp profile or a missing CAP_SYS_PTRACE forbid it; "
                               "DDP_SHM_CMA=0 stops trying)"
                             : "");
      break;
    }
    if (got != theirs.nonce) {
      reason = "process_vm_readv of " + who + " read another process";
      break;
    }
    uint64_t token = mine.nonce ^ (static_cast<uint64_t>(k) << 1);
    local = iovec{&token, sizeof(token)};
    remote.iov_base = in_their_space(me, offsetof(DirectArea, probe));
    if (const int err = write_to(static_cast<pid_t>(pid), &local, 1, &remote, 1, sizeof(token))) {
      reason = "process_vm_writev of " + who + " failed: " + errno_text(err);
      break;
    }
    // The kernel stored it on this thread's behalf, before the call returned.
    if (mine.probe.load(std::memory_order_relaxed) != token) {
      reason = "process_vm_writev of " + who + " did not land";
      break;
    }
  }

  // Everyone learns the lowest rank that could not, and its reason.
  int32_t first_failed = reason.empty() ? INT32_MAX : me;
  all_reduce(&first_failed, 1, DType::kInt32, Op::kMin);
  if (first_failed == INT32_MAX) {
    direct_ = true;
    direct_chunk_ = options_.direct_chunk_bytes;
    if (direct_chunk_ == 0) {
      // Every peer's part of a chunk stays in cache while it is folded in, and each
      // system call moves enough to pay for itself (docs/shm.md: 1 MiB beat 256 KiB by
      // 15-20% at 2 ranks).
      direct_chunk_ =
          std::clamp<size_t>((size_t(1) << 20) / static_cast<size_t>(std::max(1, n - 1)),
                             size_t(64) << 10, size_t(1) << 20);
    }
    direct_chunk_ = std::max(kLine, direct_chunk_ / kLine * kLine);
    scratch_.assign(static_cast<size_t>(n) * direct_chunk_, 0);
    span_maps_.clear();
    for (int r = 0; r < n; ++r) span_maps_.push_back(std::make_unique<SpanMap>(kMaxSpans));
    own_pieces_.resize(kMaxSpans);
    scales_.assign(static_cast<size_t>(n), 1.0);
    peer_pieces_.resize(kMaxSpans);
    return true;
  }
  char text[1024] = {};
  if (first_failed == me) std::snprintf(text, sizeof(text), "%s", reason.c_str());
  broadcast(text, sizeof(text), first_failed);
  if (why_not != nullptr) *why_not = "rank " + std::to_string(first_failed) + ": " + text;
  return false;
}

void Transport::all_reduce_direct(const std::vector<Span>& spans, DType dtype, Op op,
                                  double scale) {
  if (!direct_) {
    throw std::logic_error("all_reduce_direct on a transport whose direct all-reduce is off");
  }
  if (spans.size() > kMaxSpans) {
    throw std::invalid_argument("all_reduce_direct: " + std::to_string(spans.size()) +
                                " spans, but at most " + std::to_string(kMaxSpans));
  }
  if (scale != 1.0 && !(op == Op::kSum && (dtype == DType::kFloat32 || dtype == DType::kFloat64))) {
    throw std::invalid_argument(std::string("all_reduce_direct: a scale needs a float32 or "
                                            "float64 SUM, not ") +
                                dtype_name(dtype) + " " + op_name(op));
  }
  size_t count = 0;
  for (const Span& span : spans) count += span.count;
  run_direct(Call::reduction(Kind::kAllReduceDirect, count, dtype, op), spans, scale);
}

void Transport::fail_cross_copy(int err, int peer, const char* what, const Call& call) {
  const int64_t pid = peer_pids_[static_cast<size_t>(peer)];
  const std::string who = "rank " + std::to_string(peer) + " (pid " + std::to_string(pid) + ")";
  if (err == ESRCH) {
    fail(Error::Kind::kPeerGone,
         who + " has exited while this rank was in " + Call::describe(call.code(), call.bytes) +
             "; the group is broken",
         peer);
  }
  fail(Error::Kind::kSetup,
       std::string("could not ") + what + " the memory of " + who + " in " +
           Call::describe(call.code(), call.bytes) + ": " + errno_text(err) +
           "; the group is broken",
       peer);
}

void Transport::run_direct(const Call& call, const std::vector<Span>& spans, double scale) {
  const int n = options_.world_size;
  const int me = options_.rank;
  const size_t esize = dtype_size(call.dtype);
  // A: this rank's spans. The peers read them during their B, which ends before this
  // rank's next call begins (it waits for every B), so one area per rank suffices.
  DirectArea& area = direct_area(me);
  area.num_spans = spans.size();
  area.scale = scale;
  for (size_t k = 0; k < spans.size(); ++k) {
    area.spans[k] = SpanEntry{static_cast<uint64_t>(reinterpret_cast<uintptr_t>(spans[k].data)),
                              static_cast<uint64_t>(spans[k].count)};
  }
  enter_unit(call);

  // B: partition `me`, chunk by chunk, straight between the ranks' buffers.
  const auto [begin, end] = partition(call.bytes / esize, esize);
  if (begin < end) {
    scaled_ = false;
    for (int r = 0; r < n; ++r) {
      const DirectArea& a = direct_area(r);
      span_maps_[static_cast<size_t>(r)]->assign(a.spans, std::min<size_t>(a.num_spans, kMaxSpans),
                                                 esize);
      scales_[static_cast<size_t>(r)] = a.scale;
      scaled_ = scaled_ || a.scale != 1.0;
    }
    const size_t step = std::max<size_t>(1, direct_chunk_ / esize);
    for (size_t a = begin; a < end; a += step) {
      check_stopped(call, -1);  // a failed peer may have released its buffers: write no more
      reduce_direct_chunk(call, a, std::min(end, a + step));
    }
  }
  // The kernel's copies into the peers' memory are stores made on this thread's behalf
  // before its system calls returned; B is published after them with release order, so
  // a peer that sees B sees them.
  leave_unit(call);
}

void Transport::reduce_direct_chunk(const Call& call, size_t begin, size_t end) {
  const int n = options_.world_size;
  const int me = options_.rank;
  const size_t esize = dtype_size(call.dtype);
  const size_t bytes = (end - begin) * esize;
  for (int k = 0; k < n; ++k) {
    if (k == me) continue;
    const size_t np = span_maps_[static_cast<size_t>(k)]->pieces(begin, end, peer_pieces_.data(),
                                                                 peer_pieces_.size());
    iovec local{scratch_.data() + static_cast<size_t>(k) * direct_chunk_, bytes};
    const auto pid = static_cast<pid_t>(peer_pids_[static_cast<size_t>(k)]);
    if (const int err = read_from(pid, &local, 1, peer_pieces_.data(), np, bytes)) {
      fail_cross_copy(err, k, "read", call);
    }
  }
  const size_t no = span_maps_[static_cast<size_t>(me)]->pieces(begin, end, own_pieces_.data(),
                                                                own_pieces_.size());
  size_t done = 0;
  for (size_t p = 0; p < no; ++p) {
    const size_t count = own_pieces_[p].iov_len / esize;
    for (int r = 0; r < n; ++r) {
      inputs_[static_cast<size_t>(r)] =
          r == me ? own_pieces_[p].iov_base
                  : scratch_.data() + static_cast<size_t>(r) * direct_chunk_ + done * esize;
    }
    if (scaled_) {
      fold_scaled(call.dtype, own_pieces_[p].iov_base, inputs_.data(), n, count, scales_.data());
    } else {
      reduce(call.dtype, call.op, own_pieces_[p].iov_base, nullptr, 0, inputs_.data(), n, 0, count);
    }
    done += count;
  }
  for (int k = 0; k < n; ++k) {
    if (k == me) continue;
    const size_t np = span_maps_[static_cast<size_t>(k)]->pieces(begin, end, peer_pieces_.data(),
                                                                 peer_pieces_.size());
    const auto pid = static_cast<pid_t>(peer_pids_[static_cast<size_t>(k)]);
    if (const int err = write_to(pid, own_pieces_.data(), no, peer_pieces_.data(), np, bytes)) {
      fail_cross_copy(err, k, "write", call);
    }
  }
}

void Transport::broadcast(void* data, size_t bytes, int root) {
  Call call;
  call.kind = Kind::kBroadcast;
  call.root = root;
  call.bytes = bytes;
  call.data = data;
  run(call);
}

void Transport::all_gather(const void* input, size_t bytes, const std::vector<void*>& outputs) {
  Call call;
  call.kind = Kind::kAllGather;
  call.bytes = bytes;
  call.input = input;
  call.outputs = &outputs;
  run(call);
}

void Transport::barrier() {
  Call call;
  call.kind = Kind::kBarrier;
  run(call);
}

}  // namespace shm
}  // namespace detail
}  // namespace ddp
