// Process groups: init methods, collectives against closed forms, errors by message.

#include "support/harness.h"

#include "distributed/comm.h"

#include <ddp/errors.h>
#include <ddp/distributed/process_group.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace process_group_test {

using ddp_test::ProcessOptions;
using ddp_test::run_processes;
using ddp_test::TempDir;

namespace {

// Sets environment variables for one test and restores them after.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& kv : vars) {
      const char* old = std::getenv(kv.first);
      saved_.emplace_back(kv.first, old ? std::optional<std::string>(old) : std::nullopt);
      if (kv.second) {
        ::setenv(kv.first, kv.second, 1);
      } else {
        ::unsetenv(kv.first);
      }
    }
  }
  ~ScopedEnv() {
    for (const auto& kv : saved_) {
      if (kv.second) {
        ::setenv(kv.first.c_str(), kv.second->c_str(), 1);
      } else {
        ::unsetenv(kv.first.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Clears every launcher variable so a test starts from nothing.
ScopedEnv clean_env() {
  return ScopedEnv({{"RANK", nullptr},
                    {"WORLD_SIZE", nullptr},
                    {"LOCAL_RANK", nullptr},
                    {"LOCAL_WORLD_SIZE", nullptr},
                    {"MASTER_ADDR", nullptr},
                    {"MASTER_PORT", nullptr},
                    {"SLURM_PROCID", nullptr},
                    {"SLURM_NTASKS", nullptr},
                    {"SLURM_LOCALID", nullptr},
                    {"SLURM_NTASKS_PER_NODE", nullptr},
                    {"OMPI_COMM_WORLD_RANK", nullptr},
                    {"OMPI_COMM_WORLD_SIZE", nullptr},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", nullptr},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", nullptr},
                    {"DDP_RENDEZVOUS_DIR", nullptr}});
}

using ddp_test::error_of;

}  // namespace

// ---- Environment -----------------------------------------------------------------

TEST(EnvTest, ReadsTorchrunVariables) {
  auto env = clean_env();
  ScopedEnv set(
      {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}});
  auto info = ddp::rank_info_from_env();
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.source, "torchrun");
}

TEST(EnvTest, FallsBackToSlurmThenOpenMpi) {
  auto env = clean_env();
  {
    ScopedEnv set({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}});
    auto info = ddp::rank_info_from_env();
    EXPECT_EQ(info.source, "slurm");
    EXPECT_EQ(info.rank, 5);
    EXPECT_EQ(info.world_size, 8);
    EXPECT_EQ(info.local_rank, 1);
  }
  {
    ScopedEnv set({{"OMPI_COMM_WORLD_RANK", "2"},
                   {"OMPI_COMM_WORLD_SIZE", "3"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
    auto info = ddp::rank_info_from_env();
    EXPECT_EQ(info.source, "openmpi");
    EXPECT_EQ(info.rank, 2);
    EXPECT_EQ(info.world_size, 3);
    EXPECT_EQ(info.local_world_size, 1);
  }
  {
    // torchrun's variables win when both are present.
    ScopedEnv set(
        {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}});
    EXPECT_EQ(ddp::rank_info_from_env().source, "torchrun");
  }
}

TEST(EnvTest, RankNotBelowWorldSizeIsAnError) {
  auto env = clean_env();
  ScopedEnv set({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  const std::string msg = error_of([] { ddp::rank_info_from_env(); });
  EXPECT_NE(msg.find("RANK=4 must be < WORLD_SIZE=4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0..3"), std::string::npos) << msg;
}

TEST(EnvTest, NegativeOrNonNumericIsAnError) {
  auto env = clean_env();
  {
    ScopedEnv set({{"RANK", "-1"}, {"WORLD_SIZE", "2"}});
    const std::string msg = error_of([] { ddp::rank_info_from_env(); });
    EXPECT_NE(msg.find("RANK must be a non-negative integer, but got -1"), std::string::npos)
        << msg;
  }
  {
    ScopedEnv set({{"RANK", "0"}, {"WORLD_SIZE", "two"}});
    const std::string msg = error_of([] { ddp::rank_info_from_env(); });
    EXPECT_NE(msg.find("WORLD_SIZE must be a non-negative integer, but got 'two'"),
              std::string::npos)
        << msg;
  }
  {
    ScopedEnv set(
        {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "80x"}, {"LOCAL_WORLD_SIZE", "2"}});
    const std::string msg = error_of([] { ddp::init_process_group(); });
    EXPECT_NE(msg.find("MASTER_PORT must be a non-negative integer, but got '80x'"),
              std::string::npos)
        << msg;
  }
}

TEST(EnvTest, MissingRankNamesTheFix) {
  auto env = clean_env();
  const std::string msg = error_of([] { ddp::init_process_group(); });
  EXPECT_NE(msg.find("needs this process's rank and the world size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ddprun"), std::string::npos) << msg;
}

TEST(EnvTest, MasterAddrMissingOnMultiHost) {
  auto env = clean_env();
  ScopedEnv set(
      {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
  const std::string msg = error_of([] { ddp::init_process_group(); });
  EXPECT_NE(msg.find("MASTER_ADDR is not set, but this is a multi-host run"), std::string::npos)
      << msg;
  EXPECT_FALSE(ddp::is_initialized());
}

TEST(EnvTest, MasterPortMissingOnOneHost) {
  auto env = clean_env();
  ScopedEnv set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}});
  const std::string msg = error_of([] { ddp::init_process_group(); });
  EXPECT_NE(msg.find("needs MASTER_PORT"), std::string::npos) << msg;
}

// ---- Options and lifecycle -------------------------------------------------------

TEST(ProcessGroupTest, BadOptionsNameTheValue) {
  auto env = clean_env();
  EXPECT_NE(error_of([] {
              ddp::ProcessGroup::create(ddp::InitOptions().backend("mpi").rank(0).world_size(1));
            })
                .find("backend must be \"gloo\", \"nccl\" or \"shm\" (or empty, to choose by what "
                      "is there), but got \"mpi\""),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ddp::ProcessGroup::create(
                  ddp::InitOptions().init_method("udp://x:1").rank(0).world_size(2));
            }).find("must start with env://, tcp:// or file://, but got 'udp://x:1'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ddp::ProcessGroup::create(ddp::InitOptions().rank(2).world_size(2));
            }).find("rank 2 must be < world_size 2"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ddp::ProcessGroup::create(
                  ddp::InitOptions().init_method("tcp://localhost").rank(0).world_size(2));
            }).find("must look like host:port"),
            std::string::npos);
}

TEST(ProcessGroupTest, NcclUnavailableNamesTheFix) {
  if (ddp::is_nccl_available()) GTEST_SKIP() << "this build has NCCL";
  auto env = clean_env();
  const std::string msg = error_of(
      [] { ddp::init_process_group(ddp::InitOptions().backend("nccl").rank(0).world_size(1)); });
  EXPECT_NE(msg.find("backend \"nccl\" is not available"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rebuild against a CUDA LibTorch"), std::string::npos) << msg;
  EXPECT_FALSE(ddp::is_initialized());
}

// A CUDA LibTorch (pip torch) must give a build with NCCL; a CPU one (Debian's) without.
TEST(ProcessGroupTest, NcclIsCompiledInExactlyWithACudaLibTorch) {
  EXPECT_EQ(ddp::is_nccl_available(), DDP_TEST_TORCH_HAS_CUDA != 0);
}

// The NCCL loaded at run time is the one nccl.h came from (the nvidia-nccl wheel beside
// torch), not another libnccl.so.2 on the machine.
TEST(ProcessGroupTest, LoadedNcclIsTheCompiledOne) {
  if (!ddp::is_nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  const std::string versions = ddp::detail::nccl_versions();
  const std::string compiled = versions.substr(0, versions.find(','));
  EXPECT_NE(versions.find("loaded " + compiled.substr(compiled.find(' ') + 1)), std::string::npos)
      << versions;
  EXPECT_NO_THROW(ddp::detail::check_nccl_runtime(0)) << versions;
}

TEST(ProcessGroupTest, NcclWithoutAGpuNamesTheCause) {
  if (!ddp::is_nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  if (ddp::detail::cuda_available()) GTEST_SKIP() << "a GPU is visible";
  auto env = clean_env();
  ddp_test::TempDir dir;
  const std::string msg = error_of([&] {
    ddp::init_process_group(ddp::InitOptions().backend("nccl").rank(1).world_size(2).init_method(
        "file://" + dir.file("store")));
  });
  EXPECT_NE(msg.find("backend \"nccl\" needs a CUDA GPU, but rank 1 sees none"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("Use backend \"gloo\""), std::string::npos) << msg;
  EXPECT_FALSE(ddp::is_initialized());
}

TEST(ProcessGroupTest, CallsBeforeInitAndAfterDestroyAreErrors) {
  auto env = clean_env();
  ASSERT_FALSE(ddp::is_initialized());
  EXPECT_NE(error_of([] { ddp::get_rank(); })
                .find("not initialised: call "
                      "ddp::init_process_group() first"),
            std::string::npos);
  auto t = at::ones({2});
  EXPECT_NE(error_of([&] { ddp::all_reduce(t); }).find("not initialised"), std::string::npos);
  EXPECT_NE(error_of([] { ddp::destroy_process_group(); }).find("no default process group"),
            std::string::npos);

  ddp::init_process_group(ddp::InitOptions().rank(0).world_size(1));
  EXPECT_TRUE(ddp::is_initialized());
  EXPECT_EQ(ddp::get_rank(), 0);
  EXPECT_EQ(ddp::get_world_size(), 1);
  EXPECT_EQ(ddp::get_device(), c10::Device(c10::kCPU));
  const std::string twice =
      error_of([] { ddp::init_process_group(ddp::InitOptions().rank(0).world_size(1)); });
  EXPECT_NE(twice.find("init_process_group was called twice"), std::string::npos) << twice;

  auto pg = ddp::default_group();
  ddp::destroy_process_group();
  EXPECT_FALSE(ddp::is_initialized());
  EXPECT_NE(error_of([] { ddp::barrier(); }).find("not initialised"), std::string::npos);
  // A handle kept past destroy fails clearly too.
  EXPECT_NE(error_of([&] { pg->barrier(); }).find("was shut down"), std::string::npos);
}

TEST(ProcessGroupTest, GuardDestroysOnException) {
  auto env = clean_env();
  try {
    ddp::ProcessGroupGuard guard(ddp::InitOptions().rank(0).world_size(1));
    EXPECT_TRUE(ddp::is_initialized());
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(ddp::is_initialized());
}

TEST(ProcessGroupTest, WorldSizeOneIsIdentity) {
  auto pg = ddp::ProcessGroup::create(ddp::InitOptions().rank(0).world_size(1));
  auto t = at::arange(5, at::kFloat);
  auto expect = t.clone();
  pg->all_reduce(t, ddp::ReduceOp::SUM);
  pg->all_reduce(t, ddp::ReduceOp::AVG);
  pg->broadcast(t, 0);
  EXPECT_TRUE(at::equal(t, expect));
  auto g = pg->all_gather(t);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_TRUE(at::equal(g[0], expect));
  EXPECT_EQ(pg->all_gather_bytes("abc"), std::vector<std::string>{"abc"});
  std::vector<at::Tensor> ts{t};
  auto w = pg->all_reduce_async(ts);
  w.wait();
  EXPECT_TRUE(w.future()->completed());
  pg->barrier();
}

// ---- Collectives on threads, closed forms ---------------------------------------

class CollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesTest, ClosedForms) {
  const int n = GetParam();
  ddp_test::run_thread_groups(n, [n](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    for (int64_t numel : {0, 1, 7, 1000}) {
      auto t = at::full({numel}, static_cast<float>(r + 1));
      pg.all_reduce(t, ddp::ReduceOp::SUM);
      EXPECT_TRUE(at::allclose(t, at::full({numel}, n * (n + 1) / 2.0f)));
      t = at::full({numel}, static_cast<float>(r + 1));
      pg.all_reduce(t, ddp::ReduceOp::AVG);
      EXPECT_TRUE(at::allclose(t, at::full({numel}, (n + 1) / 2.0f)));
      t = at::full({numel}, static_cast<float>(r));
      pg.all_reduce(t, ddp::ReduceOp::MAX);
      EXPECT_TRUE(at::equal(t, at::full({numel}, static_cast<float>(n - 1))));
      t = at::full({numel}, static_cast<float>(r + 3));
      pg.all_reduce(t, ddp::ReduceOp::MIN);
      EXPECT_TRUE(at::equal(t, at::full({numel}, 3.0f)));
    }
    auto b = at::full({3}, static_cast<double>(r));
    pg.broadcast(b, n - 1);
    EXPECT_TRUE(at::equal(b, at::full({3}, static_cast<double>(n - 1))));

    auto g = pg.all_gather(at::full({2}, static_cast<int64_t>(r * 10)));
    ASSERT_EQ(static_cast<int>(g.size()), n);
    for (int q = 0; q < n; ++q) EXPECT_EQ(g[q][1].item<int64_t>(), q * 10);

    // Different lengths per rank, the empty string included.
    auto s = pg.all_gather_bytes(std::string(static_cast<size_t>(r), 'a' + r));
    ASSERT_EQ(static_cast<int>(s.size()), n);
    for (int q = 0; q < n; ++q) EXPECT_EQ(s[q], std::string(static_cast<size_t>(q), 'a' + q));

    std::vector<at::Tensor> ts{at::ones({4})};
    auto w = pg.all_reduce_async(ts, ddp::ReduceOp::AVG);
    w.wait();
    EXPECT_TRUE(at::allclose(ts[0], at::ones({4})));
    pg.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesTest, ::testing::Values(2, 3, 4));

TEST(ProcessGroupTest, AvgOfIntegersIsAnError) {
  auto pg = ddp::ProcessGroup::create(ddp::InitOptions().rank(0).world_size(1));
  auto t = at::ones({2}, at::kInt);
  EXPECT_NE(error_of([&] {
              pg->all_reduce(t, ddp::ReduceOp::AVG);
            }).find("AVG needs a floating-point tensor"),
            std::string::npos);
}

TEST(ProcessGroupTest, FileStoreRendezvousTimesOut) {
  TempDir dir;
  const std::string msg = error_of([&] {
    ddp::ProcessGroup::create(ddp_test::file_init(dir, 0, 2, std::chrono::milliseconds(1500)));
  });
  EXPECT_NE(msg.find("for the other ranks to join"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0 of 2"), std::string::npos) << msg;
}

TEST(ProcessGroupTest, MasterThatNeverAnswersTimesOut) {
  // Held but not listening: every connection attempt is refused until the timeout.
  ddp_test::HeldPort held(/*listen=*/false);
  const int port = held.port();
  const auto start = std::chrono::steady_clock::now();
  try {
    ddp::ProcessGroup::create(ddp::InitOptions()
                                  .init_method("tcp://127.0.0.1:" + std::to_string(port))
                                  .rank(1)
                                  .world_size(2)
                                  .timeout(std::chrono::milliseconds(2000)));
    FAIL() << "expected a timeout";
  } catch (const ddp::TimeoutError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("could not reach the master at 127.0.0.1:" + std::to_string(port)),
              std::string::npos)
        << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(ProcessGroupTest, PortInUseIsAnError) {
  // Another program listens on the port; rank 0 cannot serve its store there.
  ddp_test::HeldPort other;
  const std::string msg = error_of([&] {
    ddp::ProcessGroup::create(ddp::InitOptions()
                                  .init_method("tcp://127.0.0.1:" + std::to_string(other.port()))
                                  .rank(0)
                                  .world_size(2)
                                  .timeout(std::chrono::seconds(4)));
  });
  EXPECT_NE(msg.find("the port is already in use"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(other.port())), std::string::npos) << msg;
}

TEST(ProcessGroupTest, HandedOverListenSocketMustMatchThePort) {
  ddp_test::HeldPort held, other;
  const std::string fd_text = std::to_string(other.fd());
  ScopedEnv fd({{"DDP_MASTER_LISTEN_FD", fd_text.c_str()}});
  const std::string msg = error_of([&] {
    ddp::ProcessGroup::create(ddp::InitOptions()
                                  .init_method("tcp://127.0.0.1:" + std::to_string(held.port()))
                                  .rank(0)
                                  .world_size(2)
                                  .timeout(std::chrono::seconds(4)));
  });
  EXPECT_NE(msg.find("listens on port " + std::to_string(other.port())), std::string::npos) << msg;
  EXPECT_NE(msg.find("master port is " + std::to_string(held.port())), std::string::npos) << msg;
}

TEST(ProcessGroupTest, TcpInitOnThreads) {
  // The port stays held from here on: rank 0's store serves on the handed-over socket.
  ddp_test::HeldPort held;
  const int port = held.port();
  struct stat held_stat {};
  ASSERT_EQ(::fstat(held.fd(), &held_stat), 0);
  const std::string method = "tcp://127.0.0.1:" + std::to_string(port);
  const std::string fd_text = std::to_string(held.release());
  ScopedEnv fd({{"DDP_MASTER_LISTEN_FD", fd_text.c_str()}});
  ddp_test::run_threads(3, [&](int rank) {
#if TORCH_VERSION_MAJOR < 2
    // LibTorch 1.13's store cannot take the socket: rank 0 closes it and binds the port
    // again, and a client that connected to the held socket meanwhile is reset. So the
    // clients wait until the store's own socket listens (Note [Handed-over port]).
    if (rank > 0) {
      ASSERT_TRUE(ddp_test::wait_for(
          [&] {
            for (unsigned long inode : ddp_test::listening_inodes(port)) {
              if (inode != held_stat.st_ino) return true;
            }
            return false;
          },
          std::chrono::seconds(30)))
          << "rank 0's store never listened on port " << port;
    }
#endif
    auto pg = ddp::ProcessGroup::create(
        ddp::InitOptions().init_method(method).rank(rank).world_size(3).timeout(
            std::chrono::seconds(30)));
    auto t = at::ones({3});
    pg->all_reduce(t);
    EXPECT_TRUE(at::equal(t, at::full({3}, 3.0f)));
  });
}

// ---- Real processes --------------------------------------------------------------

DDP_SCENARIO(env_all_reduce) {
  ddp::ProcessGroupGuard guard(
      ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(60)));
  const int r = ddp::get_rank(), n = ddp::get_world_size();
  auto t = at::full({1000}, static_cast<float>(r + 1));
  ddp::all_reduce(t);
  if (!at::allclose(t, at::full({1000}, n * (n + 1) / 2.0f))) return 3;
  auto s = ddp::all_gather_bytes("rank" + std::to_string(r));
  for (int q = 0; q < n; ++q) {
    if (s[q] != "rank" + std::to_string(q)) return 4;
  }
  if (ddp::get_local_rank() != r) return 5;
  ddp::barrier();
  std::printf("rank %d ok\n", r);
  return 0;
}

// Started by ddprun (tests/ddprun/test_two_hosts.py): any layout, one host or several.
DDP_SCENARIO(launcher_all_reduce) {
  ddp::ProcessGroupGuard guard(
      ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(60)));
  const int r = ddp::get_rank(), n = ddp::get_world_size();
  auto t = at::full({1 << 16}, static_cast<float>(r + 1));
  ddp::all_reduce(t);
  if (!at::allclose(t, at::full({1 << 16}, n * (n + 1) / 2.0f))) return 3;
  const char* local = std::getenv("LOCAL_RANK");
  if (local == nullptr || ddp::get_local_rank() != std::atoi(local)) return 4;
  std::printf("rank %d of %d (local %d): all_reduce ok\n", r, n, ddp::get_local_rank());
  return 0;
}

// Started by tests/ddprun/test_two_hosts.py in two network namespaces, with no launcher:
// RANK and WORLD_SIZE only, init_method DDP_TEST_INIT_METHOD (file:// on a folder both
// hosts see) and backend DDP_TEST_BACKEND. Local placement must come from the peers.
DDP_SCENARIO(file_store_hosts) {
  const char* method = std::getenv("DDP_TEST_INIT_METHOD");
  const char* backend = std::getenv("DDP_TEST_BACKEND");
  const char* want_local = std::getenv("DDP_TEST_LOCAL_WORLD_SIZE");
  if (method == nullptr || want_local == nullptr) return 2;
  ddp::ProcessGroupGuard guard(ddp::InitOptions()
                                   .init_method(method)
                                   .backend(backend ? backend : "")
                                   .timeout(std::chrono::seconds(60)));
  const int r = ddp::get_rank(), n = ddp::get_world_size();
  auto t = at::full({1 << 16}, static_cast<float>(r + 1));
  ddp::all_reduce(t);
  if (!at::equal(t, at::full({1 << 16}, n * (n + 1) / 2.0f))) return 3;
  // Rounded sums, several in flight at once, of odd sizes: the same bits on every rank.
  std::vector<at::Tensor> sums;
  std::vector<ddp::Work> works;
  for (int64_t numel : {1, 7, 300001}) {
    at::manual_seed(1000 + r);
    sums.push_back(at::randn({numel}, at::kFloat));
    std::vector<at::Tensor> one{sums.back()};
    works.push_back(ddp::default_group()->all_reduce_async(one, ddp::ReduceOp::SUM));
  }
  for (auto& w : works) w.wait();
  for (const auto& s : sums) {
    const auto all = ddp::all_gather(s);
    for (const auto& other : all) {
      if (!at::equal(other, all[0])) return 5;
    }
  }
  const int lws = std::atoi(want_local);
  if (ddp::get_local_world_size() != lws || ddp::get_local_rank() != r % lws) return 4;
  ddp::barrier();
  std::printf("rank %d of %d (local %d of %d, %s): all_reduce ok\n", r, n, ddp::get_local_rank(),
              ddp::get_local_world_size(), ddp::default_group()->backend().c_str());
  return 0;
}

class MultiProcTest : public ::testing::TestWithParam<int> {};

TEST_P(MultiProcTest, EnvInitAllReduce) {
  auto results = run_processes(GetParam(), "env_all_reduce");
  ddp_test::expect_all_ok(results);
}

TEST_P(MultiProcTest, EnvInitWithMasterPortOnOneHost) {
  // No ddprun: the ranks find each other through MASTER_ADDR/MASTER_PORT alone.
  ProcessOptions o;
  o.launcher_env = false;
  const int n = GetParam();
  o.env = {{"RANK", "{rank}"},           {"WORLD_SIZE", std::to_string(n)},
           {"LOCAL_RANK", "{rank}"},     {"LOCAL_WORLD_SIZE", std::to_string(n)},
           {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
           {"DDP_RENDEZVOUS_DIR", ""},   {"OMP_NUM_THREADS", "1"}};
  // On one host the store is a file under TMPDIR named after MASTER_PORT, and TMPDIR is
  // this test's own: the port number needs no probing.
  TempDir tmp;
  o.env["TMPDIR"] = tmp.path();
  ddp_test::expect_all_ok(run_processes(n, "env_all_reduce", o));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MultiProcTest, ::testing::Values(2, 3, 4));

// The inodes of this process's sockets, from /proc/self/fd.
std::set<std::string> own_socket_inodes() {
  std::set<std::string> inodes;
  std::string out;
  ddp_test::run_command("ls -l /proc/" + std::to_string(::getpid()) + "/fd", &out);
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    const auto p = line.find("socket:[");
    if (p != std::string::npos) {
      inodes.insert(line.substr(p + 8, line.find(']', p) - p - 8));
    }
  }
  return inodes;
}

DDP_SCENARIO(listening_sockets) {
  // Under env:// on one host, no rank may listen outside loopback.
  ddp::ProcessGroupGuard guard(ddp::InitOptions().timeout(std::chrono::seconds(60)));
  auto t = at::ones({4});
  ddp::all_reduce(t);
  const auto mine = own_socket_inodes();
  std::string out;
  ddp_test::run_command("cat /proc/net/tcp /proc/net/tcp6", &out);
  ddp::barrier();
  // /proc/net/tcp: sl local rem st tx:rx tr:when retrnsmt uid timeout inode; 0A = LISTEN.
  std::istringstream in(out);
  std::string line;
  int listeners = 0, bad = 0;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, st, q, tr, re, uid, to, inode;
    if (!(f >> sl >> local >> remote >> st >> q >> tr >> re >> uid >> to >> inode)) continue;
    if (st != "0A" || mine.count(inode) == 0) continue;
    ++listeners;
    const std::string host = local.substr(0, local.find(':'));
    const bool loopback = host == "0100007F" || host == "00000000000000000000000001000000";
    if (!loopback) {
      std::fprintf(stderr, "listening outside loopback: %s\n", line.c_str());
      ++bad;
    }
  }
  std::printf("own sockets %zu, listeners %d, outside loopback %d\n", mine.size(), listeners, bad);
  return bad == 0 && !mine.empty() ? 0 : 6;
}

TEST(SecurityMultiProcTest, OneHostOpensNoNonLoopbackListener) {
  ddp_test::expect_all_ok(run_processes(2, "listening_sockets"));
}

DDP_SCENARIO(rank_dies) {
  ddp::ProcessGroupGuard guard(ddp::InitOptions().timeout(std::chrono::seconds(5)));
  if (ddp::get_rank() == 1) std::_Exit(9);
  auto t = at::ones({10});
  try {
    ddp::all_reduce(t);
  } catch (const ddp::TimeoutError& e) {
    std::fprintf(stderr, "TimeoutError: %s\n", e.what());
    return 20;
  } catch (const ddp::ProcessGroupError& e) {
    std::fprintf(stderr, "ProcessGroupError: %s\n", e.what());
    return 21;
  }
  return 0;
}

TEST(FailureMultiProcTest, DeadPeerGivesAnErrorNotAHang) {
  ProcessOptions o;
  o.timeout = std::chrono::seconds(60);
  auto results = run_processes(2, "rank_dies", o);
  EXPECT_EQ(results[1].exit_code, 9);
  EXPECT_TRUE(results[0].exit_code == 20 || results[0].exit_code == 21) << results[0].output;
  EXPECT_NE(results[0].output.find("all_reduce on rank 0 of 2"), std::string::npos)
      << results[0].output;
}

namespace {

// ddp-cpp's own errors end with the explanation: no c10 "Exception raised from ..."
// location or backtrace after it, in what() as in msg().
TEST(ErrorTextTest, OwnErrorsEndWithTheExplanation) {
  ScopedEnv env({{"RANK", "3"}, {"WORLD_SIZE", "3"}});
  try {
    ddp::rank_info_from_env();
    FAIL() << "RANK=3 of 3 was accepted";
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find("Exception raised from"), std::string::npos) << what;
    EXPECT_EQ(what.find("frame #"), std::string::npos) << what;
    EXPECT_NE(what.find("RANK=3 must be < WORLD_SIZE=3"), std::string::npos) << what;
    // Nothing after the explanation but, in LibTorch 1.13, one newline.
    EXPECT_LE(what.size(), e.msg().size() + 1) << what;
  }
}

}  // namespace

// Without LOCAL_RANK (file://, or tcp:// across hosts), the local rank comes from the hosts
// the ranks report at the rendezvous: ranks on one host count 0, 1, 2, ... and under
// NCCL each takes its own GPU. (Before, every such rank was local rank 0: cuda:0 for all.)
TEST(LocalPlacementTest, RanksWithoutLocalRankCountThemselvesPerHost) {
  ASSERT_EQ(std::getenv("LOCAL_RANK"), nullptr);
  constexpr int kWorld = 3;
  ddp_test::run_thread_groups(kWorld, [&](ddp::ProcessGroup& pg) {
    EXPECT_EQ(pg.local_rank(), pg.rank());
    EXPECT_EQ(pg.local_world_size(), kWorld);
  });
}

}  // namespace process_group_test
