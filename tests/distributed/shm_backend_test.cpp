// The "shm" backend: results against a fold in rank order and exact integer sums, bit
// equality across ranks, every dtype and op at odd sizes, world sizes 1 to 8 and 16, async
// order, 1 GiB, subgroups, the Gloo fallback, selection, a dead and a stuck peer, and
// /dev/shm left empty.

#include "support/harness.h"
#include "support/util.h"

#include "distributed/comm.h"
#include "distributed/rendezvous/host_identity.h"

#include <ddp/distributed/process_group.h>
#include <ddp/errors.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace shm_backend_test {

using ddp_test::run_processes;
using ddp_test::same_bits;
using ddp_test::TempDir;

namespace {

ddp::InitOptions shm_init(const TempDir& dir, int rank, int world,
                          const std::string& backend = "shm",
                          std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  return ddp::InitOptions()
      .backend(backend)
      .init_method("file://" + dir.file("store"))
      .rank(rank)
      .world_size(world)
      .timeout(timeout);
}

// Runs fn(pg) on `world` threads, each with its own group of `backend`.
void run_shm(int world, const std::function<void(ddp::ProcessGroup&)>& fn,
             const std::string& backend = "shm") {
  TempDir dir;
  ddp_test::run_threads(world, [&](int rank) {
    auto pg = ddp::ProcessGroup::create(shm_init(dir, rank, world, backend));
    pg->barrier();  // no rank releases its group while a peer still connects (Gloo)
    fn(*pg);
  });
}

// Rank r's input: a pseudo-random tensor, the same for the same (rank, numel, dtype).
at::Tensor input_of(int rank, int64_t numel, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + rank * 7919 + numel);
  if (at::isIntegralType(dtype, /*includeBool=*/false)) {
    return at::randint(-1000, 1000, {numel}, gen, at::TensorOptions().dtype(dtype));
  }
  return at::randn({numel}, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
}

// The fold of every rank's input in rank order; float16 and bfloat16 in float32 and
// rounded once, as the transport does (docs/shm.md, Note [Summation order]).
at::Tensor reference(int world, int64_t numel, at::ScalarType dtype, ddp::ReduceOp op) {
  const bool low = dtype == at::kHalf || dtype == at::kBFloat16;
  at::Tensor acc;
  for (int r = 0; r < world; ++r) {
    at::Tensor x = input_of(r, numel, dtype);
    if (low) x = x.to(at::kFloat);
    if (r == 0) {
      acc = x.clone();
    } else if (op == ddp::ReduceOp::MAX) {
      acc = at::maximum(acc, x);
    } else if (op == ddp::ReduceOp::MIN) {
      acc = at::minimum(acc, x);
    } else {
      acc = acc + x;
    }
  }
  acc = acc.to(dtype);
  if (op == ddp::ReduceOp::AVG) acc.div_(world);
  return acc;
}

// The /dev/shm entries whose names start with `prefix`.
std::vector<std::string> shm_entries(const std::string& prefix) {
  std::vector<std::string> found;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) found.push_back(e->d_name);
    }
    ::closedir(d);
  }
  return found;
}

std::string own_prefix(long pid) {
  return "ddp-" + std::to_string(::getuid()) + "-" + std::to_string(pid) + "-";
}

class ShmWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(ShmWorldTest, AllReduceEqualsTheFoldInRankOrderForEveryDtypeAndOp) {
  const int world = GetParam();
  const std::vector<at::ScalarType> dtypes = {at::kFloat,    at::kDouble, at::kHalf,
                                              at::kBFloat16, at::kInt,    at::kLong};
  const std::vector<ddp::ReduceOp> ops = {ddp::ReduceOp::SUM, ddp::ReduceOp::MAX,
                                          ddp::ReduceOp::MIN, ddp::ReduceOp::AVG};
  // 300001 float32 elements span three slices of the default 512 KiB.
  const std::vector<int64_t> sizes = {1, 7, 1000, 300001};
  std::mutex mu;
  std::map<std::string, std::vector<at::Tensor>> results;  // per case, per rank
  run_shm(world, [&](ddp::ProcessGroup& pg) {
    if (world > 1) {
      EXPECT_EQ(pg.backend(), "shm");
    }
    for (auto dtype : dtypes) {
      for (auto op : ops) {
        if (op == ddp::ReduceOp::AVG && at::isIntegralType(dtype, false)) continue;
        for (int64_t n : sizes) {
          at::Tensor t = input_of(pg.rank(), n, dtype);
          pg.all_reduce(t, op);
          std::lock_guard<std::mutex> lock(mu);
          auto& v = results[std::string(c10::toString(dtype)) + "/" +
                            std::to_string(static_cast<int>(op)) + "/" + std::to_string(n)];
          v.resize(static_cast<size_t>(world));
          v[static_cast<size_t>(pg.rank())] = t;
        }
      }
    }
  });
  for (auto dtype : dtypes) {
    for (auto op : ops) {
      if (op == ddp::ReduceOp::AVG && at::isIntegralType(dtype, false)) continue;
      for (int64_t n : sizes) {
        const std::string key = std::string(c10::toString(dtype)) + "/" +
                                std::to_string(static_cast<int>(op)) + "/" + std::to_string(n);
        const auto& v = results.at(key);
        const at::Tensor want = reference(world, n, dtype, op);
        for (int r = 0; r < world; ++r) {
          // Bit-identical on every rank, and to the fold (AVG: within rounding of the division).
          EXPECT_TRUE(same_bits(v[static_cast<size_t>(r)], v[0])) << key << " rank " << r;
          if (op == ddp::ReduceOp::AVG) {
            EXPECT_TRUE(at::allclose(v[static_cast<size_t>(r)].to(at::kDouble),
                                     want.to(at::kDouble), 1e-2, 1e-3))
                << key;
          } else {
            EXPECT_TRUE(same_bits(v[static_cast<size_t>(r)], want)) << key << " rank " << r;
          }
        }
      }
    }
  }
}

TEST_P(ShmWorldTest, SumsOfIntegersAreExact) {
  const int world = GetParam();
  const int64_t n = 1 << 20;  // 4 MiB of float32: eight slices
  run_shm(world, [&](ddp::ProcessGroup& pg) {
    at::Tensor idx = at::arange(n, at::kLong);
    at::Tensor f = (idx.remainder(1000) + pg.rank()).to(at::kFloat);
    at::Tensor l = idx * (pg.rank() + 1);
    pg.all_reduce(f);
    pg.all_reduce(l);
    // closed forms: sum_r (i % 1000 + r) and sum_r i (r + 1)
    const at::Tensor want_f =
        (idx.remainder(1000) * world + world * (world - 1) / 2).to(at::kFloat);
    const at::Tensor want_l = idx * (world * (world + 1) / 2);
    EXPECT_TRUE(at::equal(f, want_f));
    EXPECT_TRUE(at::equal(l, want_l));
  });
}

TEST_P(ShmWorldTest, BroadcastAllGatherReduceScatterAndBarrier) {
  const int world = GetParam();
  run_shm(world, [&](ddp::ProcessGroup& pg) {
    const int me = pg.rank();
    for (int root = 0; root < world; ++root) {
      for (int64_t n : {int64_t(1), int64_t(333), int64_t(700001)}) {
        at::Tensor t = at::full({n}, static_cast<double>(me * 10 + 1), at::kDouble);
        pg.broadcast(t, root);
        EXPECT_TRUE(at::equal(t, at::full({n}, static_cast<double>(root * 10 + 1), at::kDouble)));
      }
    }
    for (int64_t n : {int64_t(3), int64_t(300001)}) {
      const at::Tensor mine = at::arange(n, at::kInt) + me * 1000;
      const auto all = pg.all_gather(mine);
      ASSERT_EQ(static_cast<int>(all.size()), world);
      for (int r = 0; r < world; ++r)
        EXPECT_TRUE(at::equal(all[r], at::arange(n, at::kInt) + r * 1000));
    }
    const auto bytes = pg.all_gather_bytes(std::string(static_cast<size_t>(me + 1), 'a' + me));
    for (int r = 0; r < world; ++r)
      EXPECT_EQ(bytes[r], std::string(static_cast<size_t>(r + 1), 'a' + r));
    const int64_t chunk = 5;
    at::Tensor in = at::arange(chunk * world, at::kFloat) + me;
    at::Tensor out = at::empty({chunk}, at::kFloat);
    pg.reduce_scatter_tensor(out, in);
    const at::Tensor want =
        (at::arange(chunk, at::kFloat) + me * chunk) * world + world * (world - 1) / 2;
    EXPECT_TRUE(at::equal(out, want));
    at::Tensor gathered = at::empty({chunk * world}, at::kFloat);
    pg.all_gather_into_tensor(gathered, out);
    EXPECT_TRUE(at::equal(gathered, (at::arange(chunk * world, at::kFloat)) * world +
                                        world * (world - 1) / 2));
    for (int i = 0; i < 20; ++i) pg.barrier();
  });
}

TEST_P(ShmWorldTest, AsyncWorksCompleteInOrderWithTheirValues) {
  const int world = GetParam();
  run_shm(world, [&](ddp::ProcessGroup& pg) {
    std::vector<at::Tensor> tensors;
    std::vector<ddp::Work> works;
    for (int k = 0; k < 6; ++k) {
      tensors.push_back(at::full({100003 * (k % 2) + 5}, static_cast<float>(pg.rank() + k)));
      std::vector<at::Tensor> list = {tensors.back()};
      works.push_back(
          pg.all_reduce_async(list, k % 3 == 2 ? ddp::ReduceOp::AVG : ddp::ReduceOp::SUM));
    }
    for (int k = 5; k >= 0; --k) {
      works[k].wait();
      const auto value = works[k].future()->value().toTensorVector();
      const float sum = static_cast<float>(world * (world - 1) / 2 + world * k);
      const float want = k % 3 == 2 ? sum / world : sum;
      EXPECT_TRUE(at::allclose(tensors[k], at::full_like(tensors[k], want))) << "work " << k;
      ASSERT_EQ(value.size(), 1u);
      EXPECT_TRUE(value[0].is_same(tensors[k]) || at::equal(value[0], tensors[k]));
    }
  });
}

// Note [Zero-copy buffers]: buffers from the group (DDP's buckets) live in shared memory
// and reduce in place, several in flight together, bit-identical to the fold.
TEST_P(ShmWorldTest, BuffersOfTheGroupLiveInSharedMemoryAndReduceInPlace) {
  const int world = GetParam();
  const std::vector<int64_t> numels = {300001, 7, 1000, 0};
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kDouble, at::kLong, at::kFloat};
  std::mutex mu;
  std::vector<std::vector<at::Tensor>> results(static_cast<size_t>(world));
  run_shm(world, [&](ddp::ProcessGroup& pg) {
    std::vector<at::TensorOptions> options;
    for (auto dtype : dtypes) options.push_back(at::TensorOptions().dtype(dtype));
    auto buffers = ddp::detail::comm_of(pg).allocate_buffers(numels, options);
    ASSERT_EQ(buffers.size(), numels.size());
    for (size_t i = 0; i < numels.size(); ++i) {
      ASSERT_EQ(buffers[i].numel(), numels[i]);
      ASSERT_EQ(buffers[i].scalar_type(), dtypes[i]);
      EXPECT_TRUE(at::equal(buffers[i], at::zeros_like(buffers[i])));
      if (numels[i] > 0) {
        EXPECT_EQ(ddp_test::in_shared_segment(buffers[i].data_ptr()), world > 1) << "buffer " << i;
      }
    }
    for (int round = 0; round < 3; ++round) {
      std::vector<ddp::Work> works;
      for (size_t i = 0; i < 3; ++i) {
        buffers[i].copy_(input_of(pg.rank(), numels[i], dtypes[i]));
        std::vector<at::Tensor> list = {buffers[i]};
        works.push_back(pg.all_reduce_async(list, ddp::ReduceOp::SUM));
      }
      for (auto& w : works) w.wait();
    }
    std::lock_guard<std::mutex> lock(mu);
    results[static_cast<size_t>(pg.rank())] = {buffers[0].clone(), buffers[1].clone(),
                                               buffers[2].clone()};
  });
  for (size_t i = 0; i < 3; ++i) {
    const at::Tensor want = reference(world, numels[i], dtypes[i], ddp::ReduceOp::SUM);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(same_bits(results[static_cast<size_t>(r)][i], want))
          << "buffer " << i << " rank " << r;
    }
  }
}

// Note [Direct all-reduce]: each rank's own tensors, reduced where they are, scaled by
// 1/world as DDP's gradients are: the bits of a scaled copy into a buffer of the group's
// pool, all-reduced there, on every rank.
TEST_P(ShmWorldTest, TensorsReduceInPlaceWithTheBitsOfScaledBuckets) {
  const int world = GetParam();
  const std::vector<int64_t> numels = {300001, 7, 1000, 0, 65537};
  std::mutex mu;
  std::vector<std::vector<at::Tensor>> direct(static_cast<size_t>(world));
  std::vector<at::Tensor> pooled(static_cast<size_t>(world));
  run_shm(world, [&](ddp::ProcessGroup& pg) {
    ddp::detail::Comm& comm = ddp::detail::comm_of(pg);
    if (world == 1) {  // nothing to exchange: a group of one has no shared memory
      EXPECT_FALSE(comm.reduces_in_place(at::kFloat, 1));
      return;
    }
    if (::geteuid() == 0) {  // where the kernel lets a process read its peers' memory
      ASSERT_TRUE(comm.reduces_in_place(at::kFloat, numels.size()));
    }
    if (!comm.reduces_in_place(at::kFloat, numels.size())) return;
    EXPECT_TRUE(comm.reduces_in_place(at::kDouble, 1));
    EXPECT_FALSE(comm.reduces_in_place(at::kHalf, 1));
    EXPECT_FALSE(comm.reduces_in_place(at::kFloat, 5000));
    int64_t total = 0;
    std::vector<at::Tensor> tensors;
    for (int64_t n : numels) {
      tensors.push_back(input_of(pg.rank(), n, at::kFloat) * (total + 1));
      total += n;
    }
    const std::vector<at::Tensor> inputs = [&] {
      std::vector<at::Tensor> c;
      for (const auto& t : tensors) c.push_back(t.clone());
      return c;
    }();
    std::vector<void*> where;
    for (const auto& t : tensors) where.push_back(t.data_ptr());
    comm.all_reduce_in_place(tensors, 1.0 / world)->wait();
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_EQ(tensors[i].data_ptr(), where[i]) << "reduced where it is";
    }
    // The same values through a bucket of the pool: scaled copy, then all_reduce.
    at::Tensor bucket = comm.allocate_buffers({total}, {at::TensorOptions(at::kFloat)})[0];
    at::mul_out(bucket, at::cat(inputs), at::scalar_tensor(1.0 / world, at::kDouble));
    pg.all_reduce(bucket);
    std::lock_guard<std::mutex> lock(mu);
    direct[static_cast<size_t>(pg.rank())] = tensors;
    pooled[static_cast<size_t>(pg.rank())] = bucket.clone();
  });
  if (direct[0].empty()) return;  // not here (see above)
  // An independent reference: the fold of every rank's scaled values in rank order.
  at::Tensor want;
  for (int r = 0; r < world; ++r) {
    int64_t total = 0;
    std::vector<at::Tensor> parts;
    for (int64_t n : numels) {
      parts.push_back(input_of(r, n, at::kFloat) * (total + 1));
      total += n;
    }
    const at::Tensor scaled = at::cat(parts) * static_cast<float>(1.0 / world);
    want = r == 0 ? scaled : want + scaled;
  }
  for (int r = 0; r < world; ++r) {
    const at::Tensor got = at::cat(direct[static_cast<size_t>(r)]);
    EXPECT_TRUE(same_bits(got, want)) << "rank " << r;
    EXPECT_TRUE(same_bits(got, pooled[static_cast<size_t>(r)])) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmWorldTest, ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8, 16));

// The largest size the backend promises, 1 GiB of float32 and three elements more (an odd
// tail past every power of two), with a sum that is exact in float32: the same closed form
// on both ranks.
TEST(ShmBackendTest, AGibibyteSumsExactly) {
  const int64_t n = (int64_t{1} << 28) + 3;
  const at::Tensor base = at::arange(n, at::kInt).remainder_(1000).to(at::kFloat);
  run_shm(2, [&](ddp::ProcessGroup& pg) {
    at::Tensor t = base + static_cast<float>(pg.rank());
    pg.all_reduce(t);
    EXPECT_TRUE(at::equal(t, base * 2 + 1)) << "rank " << pg.rank();
    t = base * static_cast<float>(1 - pg.rank());  // rank 1 holds -base
    pg.all_reduce(t, ddp::ReduceOp::MAX);
    EXPECT_TRUE(at::equal(t, base)) << "rank " << pg.rank();
  });
}

// Every group decides for itself: ranks {0, 2} and {1, 3} of a world of four each make a
// group of their own beside the world's, and calls on the three groups interleave, some
// in flight on two groups at once.
TEST(ShmBackendTest, SubgroupsGetSharedMemoryOfTheirOwn) {
  TempDir world_dir, even_dir, odd_dir;
  ddp_test::run_threads(4, [&](int rank) {
    auto world = ddp::ProcessGroup::create(shm_init(world_dir, rank, 4));
    auto sub = ddp::ProcessGroup::create(shm_init(rank % 2 == 0 ? even_dir : odd_dir, rank / 2, 2));
    EXPECT_EQ(world->backend(), "shm");
    EXPECT_EQ(sub->backend(), "shm");
    EXPECT_EQ(sub->rank(), rank / 2);
    const int partner = rank ^ 2;  // 0 and 2, 1 and 3
    for (int k = 0; k < 4; ++k) {
      std::vector<at::Tensor> big{at::full({300001}, static_cast<float>(rank + 1 + k))};
      at::Tensor small = at::full({1001}, static_cast<float>(rank + 1 + k));
      ddp::Work w = world->all_reduce_async(big);
      sub->all_reduce(small);
      w.wait();
      // 1 + 2 + 3 + 4 over the world; the two members' values in the subgroup
      EXPECT_TRUE(at::equal(big[0], at::full({300001}, static_cast<float>(10 + 4 * k))));
      EXPECT_TRUE(
          at::equal(small, at::full({1001}, static_cast<float>(rank + partner + 2 + 2 * k))))
          << "rank " << rank << " step " << k;
    }
    sub->barrier();
    world->barrier();
  });
}

TEST(ShmBackendTest, DirectAllReduceCanBeTurnedOff) {
  ::setenv("DDP_SHM_CMA", "0", 1);
  run_shm(2, [](ddp::ProcessGroup& pg) {
    EXPECT_FALSE(ddp::detail::comm_of(pg).reduces_in_place(at::kFloat, 1));
  });
  ::unsetenv("DDP_SHM_CMA");
  run_shm(2, [](ddp::ProcessGroup& pg) {
    EXPECT_EQ(ddp::detail::comm_of(pg).reduces_in_place(at::kFloat, 1), ::geteuid() == 0);
  });
}

TEST(ShmBackendTest, NonContiguousAndUnsupportedDtypesStillReduce) {
  run_shm(3, [](ddp::ProcessGroup& pg) {
    at::Tensor m = at::arange(12, at::kFloat).reshape({3, 4}).add(pg.rank()).t();  // not contiguous
    pg.all_reduce(m);
    EXPECT_TRUE(at::equal(m, (at::arange(12, at::kFloat).reshape({3, 4}) * 3 + 3).t()));
    at::Tensor u = at::full({17}, pg.rank() + 1, at::kByte);  // Gloo carries uint8
    pg.all_reduce(u);
    EXPECT_TRUE(at::equal(u, at::full({17}, 6, at::kByte)));
    at::Tensor b = at::full({9}, pg.rank() * 2, at::kChar);
    pg.all_reduce(b, ddp::ReduceOp::MAX);
    EXPECT_TRUE(at::equal(b, at::full({9}, 4, at::kChar)));
    EXPECT_EQ(pg.backend(), "shm");
  });
}

TEST(ShmBackendTest, EmptyBackendPicksSharedMemoryOnOneHostAndGlooStaysGloo) {
  run_shm(
      2, [](ddp::ProcessGroup& pg) { EXPECT_EQ(pg.backend(), "shm"); }, "");
  run_shm(
      2, [](ddp::ProcessGroup& pg) { EXPECT_EQ(pg.backend(), "gloo"); }, "gloo");
}

TEST(ShmBackendTest, DifferentCollectivesOnTwoRanksAreAMismatchOnBoth) {
  run_shm(2, [](ddp::ProcessGroup& pg) {
    at::Tensor t = at::ones({pg.rank() == 0 ? 10 : 11});
    const std::string error = ddp_test::error_of([&] { pg.all_reduce(t); });
    EXPECT_NE(error.find("the ranks called different collectives"), std::string::npos) << error;
    EXPECT_NE(error.find("all_reduce (float32, SUM, 40 bytes)"), std::string::npos) << error;
    EXPECT_NE(error.find("all_reduce (float32, SUM, 44 bytes)"), std::string::npos) << error;
  });
}

TEST(ShmBackendTest, NothingOfTheGroupStaysInDevShm) {
  run_shm(3, [](ddp::ProcessGroup& pg) {
    at::Tensor t = at::ones({10});
    pg.all_reduce(t);
    EXPECT_TRUE(shm_entries(own_prefix(::getpid())).empty());
  });
}

TEST(HostIdentityTest, EncodesAndComparesHosts) {
  using ddp::detail::HostIdentity;
  const HostIdentity me = ddp::detail::local_host_identity();
  EXPECT_FALSE(me.boot_id.empty());
  HostIdentity back;
  ASSERT_TRUE(ddp::detail::decode(ddp::detail::encode(me), back));
  EXPECT_EQ(back.hostname, me.hostname);
  EXPECT_EQ(back.pid, me.pid);
  EXPECT_TRUE(ddp::detail::same_shm_host(me, back));
  EXPECT_FALSE(ddp::detail::decode("1", back));  // what an older peer announces
  HostIdentity other = me;
  other.boot_id = "another-boot";
  EXPECT_FALSE(ddp::detail::same_shm_host(me, other));
  other = me;
  other.hostname = "elsewhere";
  EXPECT_FALSE(ddp::detail::same_shm_host(me, other));
  other = me;
  other.shm_inode += 1;  // a container with its own /dev/shm
  EXPECT_FALSE(ddp::detail::same_shm_host(me, other));
  EXPECT_FALSE(ddp::detail::all_on_one_shm_host({me, me, other}));
  EXPECT_TRUE(ddp::detail::all_on_one_shm_host({me, me}));
}

// Note [Interface from peers]: hosts made up of identities with hand-written addresses.
static ddp::detail::HostIdentity fake_host(const std::string& name, uint64_t netns,
                                           std::vector<std::pair<std::string, std::string>> addrs) {
  ddp::detail::HostIdentity id;
  id.hostname = name;
  id.boot_id = "boot-" + name;
  id.net_namespace = netns;
  for (const auto& [cidr, iface] : addrs) {
    // cidr is "a.b.c.d/p": parsed through decode, as a peer's announcement would be.
    ddp::detail::HostIdentity parsed;
    EXPECT_TRUE(ddp::detail::decode("host-v2 x y 1 1 1 1 1 1 " + cidr + "/" + iface, parsed));
    id.addresses.push_back(parsed.addresses.at(0));
  }
  return id;
}

TEST(HostIdentityTest, CarriesNamespaceAndAddresses) {
  using ddp::detail::HostIdentity;
  const HostIdentity me = ddp::detail::local_host_identity();
  EXPECT_NE(me.net_namespace, 0u);
  HostIdentity back;
  ASSERT_TRUE(ddp::detail::decode(ddp::detail::encode(me), back));
  EXPECT_EQ(back.net_namespace, me.net_namespace);
  ASSERT_EQ(back.addresses.size(), me.addresses.size());
  for (size_t i = 0; i < me.addresses.size(); ++i) {
    EXPECT_EQ(back.addresses[i].ipv4, me.addresses[i].ipv4);
    EXPECT_EQ(back.addresses[i].prefix, me.addresses[i].prefix);
    EXPECT_EQ(back.addresses[i].interface, me.addresses[i].interface);
    EXPECT_NE(back.addresses[i].ipv4 >> 24, 127u);  // loopback is never announced
  }
  // An older peer's announcement still decodes, with no namespace and no addresses.
  ASSERT_TRUE(ddp::detail::decode("host-v1 h b 1 2 3 4", back));
  EXPECT_EQ(back.net_namespace, 0u);
  EXPECT_TRUE(back.addresses.empty());
  EXPECT_FALSE(ddp::detail::decode("host-v2 h b 1 2 3 4 5 1 10.0.0.1/33/eth0", back));
  EXPECT_FALSE(ddp::detail::decode("host-v2 h b 1 2 3 4 5 2 10.0.0.1/24/eth0", back));
  EXPECT_EQ(ddp::detail::format_ipv4(0x0a010203u, 24), "10.1.2.3/24");
}

TEST(HostIdentityTest, ChoosesTheInterfaceThatReachesEveryOtherHost) {
  using ddp::detail::choose_gloo_interface;
  const auto a = fake_host("a", 7, {{"192.168.5.10/24", "wlan0"}, {"10.1.0.1/16", "ib0"}});
  const auto a2 = a;  // a second rank on host a
  const auto b = fake_host("b", 9, {{"10.1.7.2/16", "eth3"}});
  const auto c = fake_host("c", 9, {{"10.1.200.9/16", "eth0"}, {"172.16.0.3/12", "docker0"}});
  std::string error;
  // One network host: loopback, no interface.
  EXPECT_EQ(choose_gloo_interface({a, a2}, 1, &error), "");
  EXPECT_EQ(error, "");
  // Several: the first interface whose subnet holds an address of every other host.
  EXPECT_EQ(choose_gloo_interface({a, a2, b, c}, 0, &error), "ib0");
  EXPECT_EQ(choose_gloo_interface({a, a2, b, c}, 1, &error), "ib0");
  EXPECT_EQ(choose_gloo_interface({a, a2, b, c}, 2, &error), "eth3");
  EXPECT_EQ(choose_gloo_interface({a, a2, b, c}, 3, &error), "eth0");
  EXPECT_EQ(error, "");
  // Same host name and boot, another network namespace (a container): not loopback.
  auto a_container = fake_host("a", 8, {{"10.1.9.9/16", "veth0"}});
  EXPECT_EQ(choose_gloo_interface({a, a_container}, 0, &error), "ib0");
  // A host no interface reaches: an error that names it and its addresses.
  const auto far = fake_host("far", 3, {{"8.8.8.8/32", "eth0"}});
  EXPECT_EQ(choose_gloo_interface({a, b, far}, 0, &error), "");
  EXPECT_NE(error.find("rank 2 is on 'far' with addresses 8.8.8.8/32 (eth0)"), std::string::npos)
      << error;
  EXPECT_NE(error.find("192.168.5.10/24 (wlan0)"), std::string::npos) << error;
}

TEST(HostIdentityTest, HostLayoutForTheHierarchy) {
  // Shared-memory hosts a, b, c; ranks 0..5 on a, b, a, c, b, a.
  auto host = [](const std::string& name) {
    auto id = fake_host(name, 7, {});
    id.shm_device = 1;
    id.shm_inode = name[0];
    return id;
  };
  const std::vector<ddp::detail::HostIdentity> ids{host("a"), host("b"), host("a"),
                                                   host("c"), host("b"), host("a")};
  const auto l5 = ddp::detail::host_layout(ids, 5);
  EXPECT_EQ(l5.host, 0);
  EXPECT_EQ(l5.hosts, 3);
  EXPECT_EQ(l5.local_rank, 2);
  EXPECT_EQ(l5.local_size, 3);
  EXPECT_EQ(l5.largest_host, 3);
  EXPECT_EQ(l5.host_ranks, (std::vector<int>{0, 2, 5}));
  EXPECT_FALSE(l5.leader());
  const auto l4 = ddp::detail::host_layout(ids, 4);
  EXPECT_EQ(l4.host, 1);
  EXPECT_EQ(l4.local_rank, 1);
  EXPECT_EQ(l4.host_ranks, (std::vector<int>{1, 4}));
  const auto l3 = ddp::detail::host_layout(ids, 3);
  EXPECT_EQ(l3.host, 2);
  EXPECT_TRUE(l3.leader());
  EXPECT_EQ(l3.local_size, 1);
  EXPECT_TRUE(ddp::detail::wants_hierarchy(l3));
  // One host, or one rank per host: no hierarchy.
  EXPECT_FALSE(ddp::detail::wants_hierarchy(ddp::detail::host_layout({host("a"), host("a")}, 0)));
  EXPECT_FALSE(
      ddp::detail::wants_hierarchy(ddp::detail::host_layout({host("a"), host("b"), host("c")}, 1)));
}

TEST(HostIdentityTest, LocalPlacementGroupsRanksByNetworkHost) {
  const auto a = fake_host("a", 7, {});
  const auto b = fake_host("b", 7, {});
  const std::vector<ddp::detail::HostIdentity> ids{a, b, a, b, b};
  const int want_rank[] = {0, 0, 1, 1, 2};
  const int want_size[] = {2, 3, 2, 3, 3};
  for (int r = 0; r < 5; ++r) {
    const auto p = ddp::detail::local_placement(ids, r);
    EXPECT_EQ(p.local_rank, want_rank[r]) << "rank " << r;
    EXPECT_EQ(p.local_world_size, want_size[r]) << "rank " << r;
  }
}

// ---- Processes ---------------------------------------------------------------------

constexpr int kBroken = 21;
constexpr int kTimedOut = 22;

// Rank 2 is killed (SIGKILL) after the first all-reduces; ranks 0 and 1 go on, with
// ordinary tensors, buffers of the group's pool (as DDP's buckets) and tensors reduced
// where they are (as DDP's gradients) in turn, and must fail with an error naming it,
// long before the 60 s timeout. Then rank 0, which made the segment and the pool, is
// killed too: nothing may stay in /dev/shm.
DDP_SCENARIO(shm_dead_peer) {
  ddp::ProcessGroupGuard guard(ddp::InitOptions().backend("shm").timeout(std::chrono::seconds(60)));
  std::printf("pid=%ld\n", static_cast<long>(::getpid()));
  std::fflush(stdout);
  at::Tensor t = at::ones({1 << 20});
  at::Tensor bucket = ddp::detail::comm_of(*ddp::default_group())
                          .allocate_buffers({1 << 20}, {at::TensorOptions(at::kFloat)})[0];
  bucket.fill_(1);
  ddp::detail::Comm& comm = ddp::detail::comm_of(*ddp::default_group());
  std::vector<at::Tensor> grads = {at::ones({1 << 19}), at::ones({(1 << 19) + 3})};
  const bool in_place = comm.reduces_in_place(at::kFloat, grads.size());
  if (::geteuid() == 0 && !in_place) return 2;  // the kernel allows it to root
  auto one_call = [&](int i) {
    if (i % 3 == 2 && in_place) {
      comm.all_reduce_in_place(grads, 1.0 / 3)->wait();
    } else {
      ddp::all_reduce(i % 3 == 0 ? t : bucket);
    }
  };
  for (int i = 0; i < 3; ++i) one_call(i);
  if (ddp::get_rank() == 2) ::raise(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 1000; ++i) one_call(i);
  } catch (const ddp::ProcessGroupError& e) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("ProcessGroupError after %.1f s: %s\n", s, e.what());
    std::fflush(stdout);
    if (ddp::get_rank() == 0) ::raise(SIGKILL);
    return s < 15 ? kBroken : 1;
  }
  return 0;
}

// Whether this process holds a descriptor of one of ddp-cpp's memfd segments.
bool holds_memfd_segment() {
  bool found = false;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) {
      char target[256] = {};
      const std::string link = std::string("/proc/self/fd/") + e->d_name;
      if (::readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
          std::strstr(target, "/memfd:ddp-") != nullptr) {
        found = true;
      }
    }
    ::closedir(d);
  }
  return found;
}

constexpr int kRank0Died = 23;

// Rank 0 is killed while it waits for rank 1 to map the pool it just made, the window
// in which a named segment would exist in /dev/shm (Note [Segments without a name]).
// Rank 1 learns of the death in its next collective.
DDP_SCENARIO(shm_killed_during_setup) {
  ddp::ProcessGroupGuard guard(ddp::InitOptions().backend("shm").timeout(std::chrono::seconds(20)));
  std::printf("pid=%ld\n", static_cast<long>(::getpid()));
  std::fflush(stdout);
  if (ddp::get_rank() == 0) {
    std::thread killer([] {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(15);
      while (!holds_memfd_segment() && shm_entries(own_prefix(::getpid())).empty() &&
             std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ::raise(SIGKILL);
    });
    ddp::detail::comm_of(*ddp::default_group())
        .allocate_buffers({1 << 20}, {at::TensorOptions(at::kFloat)});
    killer.join();
    return 1;
  }
  try {
    ddp::barrier();
  } catch (const ddp::ProcessGroupError& e) {
    std::printf("ProcessGroupError: %s\n", e.what());
    return kRank0Died;
  }
  return 1;
}

// Rank 1 is alive but never calls: rank 0 gets TimeoutError after its 2 s timeout.
DDP_SCENARIO(shm_stuck_peer) {
  ddp::ProcessGroupGuard guard(ddp::InitOptions().backend("shm").timeout(std::chrono::seconds(2)));
  if (ddp::get_rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    return 0;
  }
  at::Tensor t = at::ones({1000});
  const auto start = std::chrono::steady_clock::now();
  try {
    ddp::all_reduce(t);
  } catch (const ddp::TimeoutError& e) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("TimeoutError after %.1f s: %s\n", s, e.what());
    return s >= 1.5 && s < 5 ? kTimedOut : 1;
  }
  return 0;
}

// torchrun's environment and an empty backend: shared memory, and correct sums.
DDP_SCENARIO(shm_env_auto) {
  ddp::ProcessGroupGuard guard(ddp::InitOptions().timeout(std::chrono::seconds(30)));
  if (ddp::default_group()->backend() != "shm") return 3;
  const int n = ddp::get_world_size();
  at::Tensor t = at::full({300001}, static_cast<float>(ddp::get_rank() + 1));
  ddp::all_reduce(t);
  return at::equal(t, at::full({300001}, static_cast<float>(n * (n + 1) / 2))) ? 0 : 4;
}

std::vector<long> printed_pids(const std::vector<ddp_test::ProcessResult>& results) {
  std::vector<long> pids;
  for (const auto& r : results) {
    const size_t at = r.output.find("pid=");
    if (at != std::string::npos) pids.push_back(std::stol(r.output.substr(at + 4)));
  }
  return pids;
}

TEST(ShmBackendMultiProcTest, ADeadPeerIsAnErrorNotAHangAndLeavesNothingInDevShm) {
  const auto results = run_processes(3, "shm_dead_peer");
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].exit_code, 128 + SIGKILL) << results[0].output;
  EXPECT_EQ(results[1].exit_code, kBroken) << results[1].output;
  EXPECT_EQ(results[2].exit_code, 128 + SIGKILL) << results[2].output;
  for (int r : {0, 1}) {
    EXPECT_NE(results[r].output.find("rank 2 (pid"), std::string::npos) << results[r].output;
    EXPECT_NE(results[r].output.find("has exited"), std::string::npos) << results[r].output;
  }
  const auto pids = printed_pids(results);
  EXPECT_EQ(pids.size(), 3u);
  for (long pid : pids) EXPECT_TRUE(shm_entries(own_prefix(pid)).empty()) << "pid " << pid;
}

TEST(ShmBackendMultiProcTest, AKillDuringSetupLeavesNothingInDevShm) {
  const auto results = run_processes(2, "shm_killed_during_setup");
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].exit_code, 128 + SIGKILL) << results[0].output;
  EXPECT_EQ(results[1].exit_code, kRank0Died) << results[1].output;
  const auto pids = printed_pids(results);
  ASSERT_EQ(pids.size(), 2u);
  for (long pid : pids) EXPECT_TRUE(shm_entries(own_prefix(pid)).empty()) << "pid " << pid;
}

TEST(ShmBackendMultiProcTest, AStuckPeerIsATimeout) {
  const auto results = run_processes(2, "shm_stuck_peer");
  EXPECT_EQ(results[0].exit_code, kTimedOut) << results[0].output;
  EXPECT_NE(results[0].output.find("timed out"), std::string::npos) << results[0].output;
  EXPECT_NE(results[0].output.find("waiting for rank 1"), std::string::npos) << results[0].output;
}

TEST(ShmBackendMultiProcTest, EmptyBackendUsesSharedMemoryUnderALauncher) {
  ddp_test::expect_all_ok(run_processes(4, "shm_env_auto"));
}

}  // namespace

}  // namespace shm_backend_test
