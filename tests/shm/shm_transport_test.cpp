// The shared-memory transport on its own (no LibTorch), built with ThreadSanitizer where
// the compiler has it: ranks are threads of one process, each with its own mapping of
// the segment, so that TSan sees every access of the protocol. Exits 0 when every check
// passes; prints what failed otherwise.

#include "distributed/shm/shm_transport.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

using namespace ddp::detail::shm;

namespace {

int failures = 0;
std::mutex print_mutex;

void check(bool ok, const std::string& what) {
  if (ok) return;
  std::lock_guard<std::mutex> lock(print_mutex);
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  ++failures;
}

// Whether segments are made with a name in /dev/shm (ranks in another pid namespace)
// instead of as a memfd (Note [Segments without a name]).
bool g_named = false;

// Runs body(transport) on o.world_size threads, each with its own mapping of one segment.
void run_world(Options o, const std::function<void(Transport&)>& body) {
  const int world = o.world_size;
  o.rank = 0;
  const std::string name = Transport::unique_name();
  std::unique_ptr<Transport> root = Transport::create(name, o, g_named);
  std::vector<std::unique_ptr<Transport>> ranks(static_cast<size_t>(world));
  for (int r = 1; r < world; ++r) {
    Options ro = o;
    ro.rank = r;
    ranks[static_cast<size_t>(r)] = Transport::open(root->where(), ro);
  }
  ranks[0] = std::move(root);
  ranks[0]->unlink();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { body(*ranks[static_cast<size_t>(r)]); });
  }
  for (auto& t : threads) t.join();
}

void run_world(int world, size_t slice_bytes, std::chrono::milliseconds timeout,
               const std::function<void(Transport&)>& body) {
  Options o;
  o.world_size = world;
  o.slice_bytes = slice_bytes;
  o.timeout = timeout;
  run_world(o, body);
}

float input(int rank, size_t i) {
  return static_cast<float>((i * 7 + static_cast<size_t>(rank) * 13) % 101) * 0.25f;
}

void all_reduce_matches_the_fold(int world, size_t count, size_t slice) {
  std::vector<std::vector<float>> out(static_cast<size_t>(world));
  run_world(world, slice, std::chrono::seconds(30), [&](Transport& t) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = input(t.rank(), i);
    for (int k = 0; k < 3; ++k) {
      std::vector<float> w = v;
      t.all_reduce(w.data(), count, DType::kFloat32, Op::kSum);
      if (k == 2) out[static_cast<size_t>(t.rank())] = w;
    }
    t.barrier();
  });
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    float want = input(0, i);
    for (int r = 1; r < world; ++r) want += input(r, i);
    for (int r = 0; r < world; ++r) {
      if (std::memcmp(&out[static_cast<size_t>(r)][i], &want, sizeof(float)) != 0) ++bad;
    }
  }
  check(bad == 0, "all_reduce of " + std::to_string(count) + " floats on " + std::to_string(world) +
                      " ranks: " + std::to_string(bad) + " wrong");
}

void broadcast_and_gather(int world) {
  const size_t bytes = 10007;
  std::atomic<int> bad{0};
  run_world(world, 4096, std::chrono::seconds(30), [&](Transport& t) {
    for (int root = 0; root < world; ++root) {
      std::vector<unsigned char> b(bytes, static_cast<unsigned char>(t.rank()));
      t.broadcast(b.data(), bytes, root);
      for (unsigned char c : b) bad += c != root;
    }
    std::vector<unsigned char> mine(bytes, static_cast<unsigned char>(t.rank() + 1));
    std::vector<std::vector<unsigned char>> all(static_cast<size_t>(world),
                                                std::vector<unsigned char>(bytes));
    std::vector<void*> ptrs;
    for (auto& a : all) ptrs.push_back(a.data());
    t.all_gather(mine.data(), bytes, ptrs);
    for (int r = 0; r < world; ++r) {
      for (unsigned char c : all[static_cast<size_t>(r)]) bad += c != r + 1;
    }
  });
  check(bad == 0, "broadcast/all_gather on " + std::to_string(world) + " ranks");
}

void a_missing_rank_times_out_and_stops_the_others() {
  std::atomic<int> timed_out{0}, aborted{0};
  run_world(3, 4096, std::chrono::milliseconds(300), [&](Transport& t) {
    if (t.rank() == 2) return;  // never calls
    float x = 1;
    try {
      t.all_reduce(&x, 1, DType::kFloat32, Op::kSum);
    } catch (const Error& e) {
      if (e.kind() == Error::Kind::kTimeout) ++timed_out;
      if (e.kind() == Error::Kind::kAborted) ++aborted;
    }
  });
  // The rank that gives up first stops the other, which fails as a timeout too: the
  // rank it waited for did not come.
  check(timed_out == 2 && aborted == 0, "a missing rank: timeouts " +
                                            std::to_string(timed_out.load()) + ", aborts " +
                                            std::to_string(aborted.load()));
}

// Note [Zero-copy buffers]: each rank's part of one pool (its own mapping), all-reduced
// in place, mixed with ordinary all-reduces that use the slots in between.
void pool_all_reduce_matches_the_fold(int world, size_t count, size_t slice) {
  const size_t offset = 4096;
  const size_t part = offset + count * sizeof(double) + 64;
  const std::string name = Transport::unique_name();
  std::vector<std::shared_ptr<SharedPool>> pools(static_cast<size_t>(world));
  pools[0] = SharedPool::create(name, world, part, 7, g_named);
  for (int r = 1; r < world; ++r)
    pools[static_cast<size_t>(r)] = SharedPool::open(pools[0]->where(), world, part, 7);
  pools[0]->unlink();
  std::atomic<int> bad{0};
  run_world(world, slice, std::chrono::seconds(30), [&](Transport& t) {
    const int me = t.rank();
    SharedPool& pool = *pools[static_cast<size_t>(me)];
    auto* mine = reinterpret_cast<double*>(pool.part(me) + offset);
    for (int k = 0; k < 3; ++k) {
      for (size_t i = 0; i < count; ++i) mine[i] = input(me, i) + k;
      t.all_reduce_in_pool(pool, offset, count, DType::kFloat64, Op::kSum);
      // An ordinary all-reduce in between: both kinds share the slots.
      std::vector<float> v(count % 5000 + 1);
      for (size_t i = 0; i < v.size(); ++i) v[i] = input(me, i);
      t.all_reduce(v.data(), v.size(), DType::kFloat32, Op::kSum);
      for (size_t i = 0; i < count; ++i) {
        double want = static_cast<double>(input(0, i)) + k;
        for (int r = 1; r < world; ++r) want += static_cast<double>(input(r, i)) + k;
        if (std::memcmp(&mine[i], &want, sizeof(double)) != 0) ++bad;
      }
      for (size_t i = 0; i < v.size(); ++i) {
        float want = input(0, i);
        for (int r = 1; r < world; ++r) want += input(r, i);
        if (v[i] != want) ++bad;
      }
    }
    t.barrier();
  });
  check(bad == 0, "all_reduce_in_pool of " + std::to_string(count) + " doubles on " +
                      std::to_string(world) + " ranks: " + std::to_string(bad.load()) + " wrong");
}

// Ranks are threads of this process: each may read and write the others' memory.
void enable_direct_on_all(Transport& t) {
  for (int r = 0; r < t.world_size(); ++r) {
    if (r != t.rank()) t.set_peer_pid(r, ::getpid());  // ranks are threads of this process
  }
  std::string why;
  check(t.enable_direct(true, &why),
        "enable_direct on rank " + std::to_string(t.rank()) + ": " + why);
}

// Rank 0 makes the call `odd`, rank 1 an ordinary all-reduce of 4 floats: a mismatch on
// both, not a wrong result.
void a_mismatch_on_both(const std::string& what, bool direct,
                        const std::function<void(Transport&, float*)>& odd) {
  std::atomic<int> mismatches{0}, others{0};
  run_world(2, 4096, std::chrono::seconds(10), [&](Transport& t) {
    if (direct) enable_direct_on_all(t);
    float x[4] = {1, 2, 3, 4};
    try {
      if (t.rank() == 0) {
        odd(t, x);
      } else {
        t.all_reduce(x, 4, DType::kFloat32, Op::kSum);
      }
    } catch (const Error& e) {
      (e.kind() == Error::Kind::kMismatch ? mismatches : others)++;
    }
  });
  check(mismatches >= 1 && mismatches + others == 2,
        what + " against plain all_reduce: mismatches " + std::to_string(mismatches.load()) +
            ", other errors " + std::to_string(others.load()));
}

void pool_and_plain_calls_are_a_mismatch() {
  const std::string name = Transport::unique_name();
  std::vector<std::shared_ptr<SharedPool>> pools(2);
  pools[0] = SharedPool::create(name, 2, 4096, 1);
  pools[1] = SharedPool::open(pools[0]->where(), 2, 4096, 1);
  pools[0]->unlink();
  a_mismatch_on_both("pool", false, [&](Transport& t, float*) {
    t.all_reduce_in_pool(*pools[0], 0, 4, DType::kFloat32, Op::kSum);
  });
}

// Note [Direct all-reduce]: each rank's own vectors, split into spans differently on
// each rank, all-reduced through the peers' memory; interleaved with ordinary and pool
// all-reduces, which share the slots.
template <typename T>
void direct_all_reduce_matches_the_fold(int world, size_t count, size_t chunk_bytes) {
  std::atomic<int> bad{0};
  Options o;
  o.world_size = world;
  o.slice_bytes = 4096;
  o.timeout = std::chrono::seconds(30);
  o.direct_chunk_bytes = chunk_bytes;
  const DType dtype = sizeof(T) == 4 ? DType::kFloat32 : DType::kFloat64;
  // Each rank scales its own values, as DDP's buckets do: rank 1 by 1 (under ddp::join a
  // rank that shadows with zeros may keep another divisor), the others by 1/world.
  auto scale_of = [world](int r) { return r == 1 ? 1.0 : 1.0 / world; };
  run_world(o, [&](Transport& t) {
    const int me = t.rank();
    enable_direct_on_all(t);
    std::vector<T> all(count);
    // Rank r cuts its elements into spans of (k + 1)^2 (r + 1) + 1 elements (the last one
    // takes the rest), so that pieces of a chunk start at different places on each rank.
    std::vector<Span> spans;
    for (size_t at = 0, k = 0; at < count; ++k) {
      const size_t len = std::min(count - at, (k + 1) * (k + 1) * static_cast<size_t>(me + 1) + 1);
      spans.push_back(Span{all.data() + at, len});
      at += len;
    }
    for (int k = 0; k < 3; ++k) {
      for (size_t i = 0; i < count; ++i) all[i] = static_cast<T>(input(me, i)) + k;
      t.all_reduce_direct(spans, dtype, Op::kSum, scale_of(me));
      std::vector<float> v(count % 3000 + 1);
      for (size_t i = 0; i < v.size(); ++i) v[i] = input(me, i);
      t.all_reduce(v.data(), v.size(), DType::kFloat32, Op::kSum);
      for (size_t i = 0; i < count; ++i) {
        T want = (static_cast<T>(input(0, i)) + k) * static_cast<T>(scale_of(0));
        for (int r = 1; r < world; ++r) {
          const T scaled = (static_cast<T>(input(r, i)) + k) * static_cast<T>(scale_of(r));
          want = want + scaled;
        }
        if (std::memcmp(&all[i], &want, sizeof(T)) != 0) ++bad;
      }
      for (size_t i = 0; i < v.size(); ++i) {
        float want = input(0, i);
        for (int r = 1; r < world; ++r) want += input(r, i);
        if (v[i] != want) ++bad;
      }
    }
    // Unscaled, another op: the maximum over ranks, exactly.
    std::vector<int32_t> ints(count);
    for (size_t i = 0; i < count; ++i) ints[i] = static_cast<int32_t>((i * 31 + me * 17) % 1009);
    t.all_reduce_direct({Span{ints.data(), count}}, DType::kInt32, Op::kMax);
    for (size_t i = 0; i < count; ++i) {
      int32_t want = 0;
      for (int r = 0; r < world; ++r)
        want = std::max(want, static_cast<int32_t>((i * 31 + r * 17) % 1009));
      if (ints[i] != want) ++bad;
    }
    t.barrier();
  });
  check(bad == 0, "all_reduce_direct of " + std::to_string(count) + " " +
                      (sizeof(T) == 4 ? "floats" : "doubles") + " on " + std::to_string(world) +
                      " ranks (chunks of " + std::to_string(chunk_bytes) +
                      " bytes): " + std::to_string(bad.load()) + " wrong");
}

// A rank that votes no, or whose peer is in another pid namespace (no pid), turns the
// direct all-reduce off on every rank, which all say why.
void direct_is_agreed_by_every_rank() {
  for (int case_no = 0; case_no < 2; ++case_no) {
    std::atomic<int> enabled{0}, named{0};
    Options o;
    o.world_size = 3;
    o.slice_bytes = 4096;
    o.timeout = std::chrono::seconds(10);
    run_world(o, [&](Transport& t) {
      for (int r = 0; r < 3; ++r) {
        if (r != t.rank()) t.set_peer_pid(r, case_no == 1 && r == 2 ? 0 : ::getpid());
      }
      std::string why;
      const bool on = t.enable_direct(!(case_no == 0 && t.rank() == 1), &why);
      enabled += on;
      const std::string expected =
          case_no == 0 ? "rank 1: turned off" : "is in another pid namespace";
      named += why.find(expected) != std::string::npos;
      check(!t.direct(), "direct() is false after a failed probe");
    });
    check(enabled == 0 && named == 3, "direct all-reduce refused on every rank, case " +
                                          std::to_string(case_no) + ": " +
                                          std::to_string(enabled.load()) + " enabled, " +
                                          std::to_string(named.load()) + " gave the reason");
  }
}

void direct_and_plain_calls_are_a_mismatch() {
  a_mismatch_on_both("direct", true, [](Transport& t, float* x) {
    t.all_reduce_direct({Span{x, 4}}, DType::kFloat32, Op::kSum);
  });
}

}  // namespace

bool in_dev_shm(const std::string& name) {
  struct stat st {};
  return ::stat(("/dev/shm" + name).c_str(), &st) == 0;
}

// The permission bits of a segment, reached through its where(): a name in /dev/shm, or
// "fd:<pid>:<fd>:<inode>" (the creator's descriptor in /proc), or -1 if neither stats.
int mode_of(const std::string& where) {
  int pid = 0, fd = 0;
  unsigned long long ino = 0;
  const std::string path = std::sscanf(where.c_str(), "fd:%d:%d:%llu", &pid, &fd, &ino) == 3
                               ? "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd)
                               : "/dev/shm" + where;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 07777);
}

void check_private(const std::string& where, const std::string& what) {
  const int mode = mode_of(where);
  char seen[16];
  std::snprintf(seen, sizeof seen, "%o", mode);
  check(mode == 0600, what + " is private to its user (mode 600): mode " + seen);
}

// Note [Segments without a name]: a memfd segment never appears in /dev/shm, and once
// rank 0 has closed its descriptor (unlink), nobody can open it any more, with a message
// that says why. A named one is in /dev/shm until unlink.
void segments_leave_nothing_behind() {
  Options o;
  o.world_size = 2;
  o.slice_bytes = 4096;
  const std::string name = Transport::unique_name();
  auto root = Transport::create(name, o);
  check(!in_dev_shm(name), "a memfd segment is not in /dev/shm");
  check(root->where().rfind("fd:", 0) == 0, "a memfd segment is reached through a descriptor");
  check_private(root->where(), "a memfd segment");
  // Run-unique names: the user, the pid and 64 random bits.
  const std::string prefix =
      "/ddp-" + std::to_string(::getuid()) + "-" + std::to_string(::getpid()) + "-";
  check(name.rfind(prefix, 0) == 0 && name.size() == prefix.size() + 16 &&
            Transport::unique_name() != name,
        "segment names are /ddp-<uid>-<pid>-<64 random bits>: " + name);
  o.rank = 1;
  auto peer = Transport::open(root->where(), o);
  root->unlink();
  try {
    Transport::open(root->where(), o);
    check(false, "a memfd segment cannot be opened after rank 0 closed it");
  } catch (const Error& e) {
    check(e.kind() == Error::Kind::kSetup &&
              std::string(e.what()).find("rank 0") != std::string::npos,
          std::string("the message of a late open names rank 0: ") + e.what());
  }
  const std::string pool_name = Transport::unique_name();
  auto pool = SharedPool::create(pool_name, 2, 4096, 3);
  check(!in_dev_shm(pool_name), "a memfd pool is not in /dev/shm");
  check_private(pool->where(), "a memfd pool");
  pool->unlink();
  auto named = SharedPool::create(pool_name, 2, 4096, 4, /*named=*/true);
  check(in_dev_shm(pool_name), "a named pool is in /dev/shm until unlink");
  check(named->where() == pool_name, "a named pool is reached through its name");
  check_private(pool_name, "a named pool");
  named->unlink();
  check(!in_dev_shm(pool_name), "unlink removes a named pool from /dev/shm");
}

int main() {
  for (int world : {1, 2, 3, 5, 8}) {
    all_reduce_matches_the_fold(world, 1, 4096);
    all_reduce_matches_the_fold(world, 30001, 4096);  // many slices through both slots
    broadcast_and_gather(world);
  }
  all_reduce_matches_the_fold(2, 1000003, 1 << 20);
  for (int world : {1, 2, 3, 5, 8}) {
    pool_all_reduce_matches_the_fold(world, 1, 4096);
    pool_all_reduce_matches_the_fold(world, 30001, 4096);
  }
  pool_and_plain_calls_are_a_mismatch();
  for (int world : {1, 2, 3, 5, 8}) {
    direct_all_reduce_matches_the_fold<float>(world, 1, 0);
    direct_all_reduce_matches_the_fold<float>(world, 30001, 4096);  // many chunks and pieces
    direct_all_reduce_matches_the_fold<double>(world, 30001, 0);
  }
  direct_all_reduce_matches_the_fold<float>(2, 1000003, 0);
  direct_is_agreed_by_every_rank();
  direct_and_plain_calls_are_a_mismatch();
  a_missing_rank_times_out_and_stops_the_others();
  segments_leave_nothing_behind();
  g_named = true;  // the same protocol over segments with a name
  all_reduce_matches_the_fold(3, 30001, 4096);
  pool_all_reduce_matches_the_fold(3, 30001, 4096);
  if (failures == 0) std::printf("shm transport: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
