// Hangs and desyncs explained, each as real processes: debug-mode fingerprints (a
// skipped collective, different ops, different shapes), a rendezvous that names the
// rank that never came, monitored_barrier naming a stuck rank, and the flight recorder
// with its reader. Every case asserts the ranks and calls named, and ends well within
// its process timeout.

#include "support/harness.h"

#include <ddp/errors.h>
#include <ddp/distributed/process_group.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace diagnostics_test {

using ddp_test::ProcessOptions;
using ddp_test::run_processes;
using ddp_test::TempDir;

namespace {

constexpr int kMismatch = 30;
constexpr int kTimeout = 31;

// Runs `body` in a debug-mode group; reports ddp's errors as exit codes and text.
int with_debug_group(const std::function<void()>& body,
                     std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  ddp::ProcessGroupGuard guard(ddp::InitOptions().backend("gloo").debug("detail").timeout(timeout));
  try {
    body();
  } catch (const ddp::MismatchError& e) {
    std::fprintf(stderr, "MismatchError: %s\n", e.what());
    return kMismatch;
  } catch (const ddp::TimeoutError& e) {
    std::fprintf(stderr, "TimeoutError: %s\n", e.what());
    return kTimeout;
  }
  return 0;
}

void expect_has(const ddp_test::ProcessResult& r, const std::string& fragment) {
  EXPECT_NE(r.output.find(fragment), std::string::npos)
      << "rank " << r.rank << " should say: " << fragment << "\n--- its output:\n"
      << r.output;
}

DDP_SCENARIO(debug_skipped_all_reduce) {
  return with_debug_group([] {
    auto t = at::ones({4});
    ddp::all_reduce(t);
    if (ddp::get_rank() != 1) ddp::all_reduce(t);  // rank 1 skips the second one
    ddp::barrier();
  });
}

DDP_SCENARIO(debug_different_ops) {
  return with_debug_group([] {
    auto t = at::ones({4});
    if (ddp::get_rank() == 0) {
      ddp::broadcast(t, 0);
    } else {
      ddp::all_reduce(t);
    }
  });
}

DDP_SCENARIO(debug_different_shapes) {
  return with_debug_group([] {
    auto t = at::ones({ddp::get_rank() == 1 ? 5 : 4});
    ddp::all_reduce(t);
  });
}

// PyTorch's variable turns the mode on too (the test sets TORCH_DISTRIBUTED_DEBUG).
DDP_SCENARIO(torch_debug_env_shapes) {
  ddp::ProcessGroupGuard guard(
      ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(20)));
  try {
    auto t = at::ones({ddp::get_rank() == 1 ? 5 : 4});
    ddp::all_reduce(t);
  } catch (const ddp::MismatchError& e) {
    std::fprintf(stderr, "MismatchError: %s\n", e.what());
    return kMismatch;
  }
  return 0;
}

DDP_SCENARIO(debug_matching_calls) {
  return with_debug_group([] {
    auto t = at::full({4}, static_cast<float>(ddp::get_rank() + 1));
    ddp::all_reduce(t);
    ddp::broadcast(t, 1);
    ddp::all_gather(t);
    ddp::barrier();
    const int n = ddp::get_world_size();
    if (!at::equal(t, at::full({4}, n * (n + 1) / 2.0f))) throw std::runtime_error("wrong sum");
  });
}

class DiagnosticsMultiProcTest : public ::testing::TestWithParam<int> {};

TEST_P(DiagnosticsMultiProcTest, DebugModeNamesASkippedCollective) {
  const auto results = run_processes(GetParam(), "debug_skipped_all_reduce");
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, kMismatch) << r.output;
    expect_has(r, "rank 1 is at barrier #2 while rank 0 is at all_reduce(sum) #2 [float 4]");
  }
}

TEST_P(DiagnosticsMultiProcTest, DebugModeNamesDifferentOps) {
  const auto results = run_processes(GetParam(), "debug_different_ops");
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, kMismatch) << r.output;
    expect_has(r, "rank 1 is at all_reduce(sum) #1 [float 4] while rank 0 is at broadcast #1 "
                  "[float 4] from rank 0");
  }
}

TEST_P(DiagnosticsMultiProcTest, DebugModeNamesDifferentShapes) {
  const auto results = run_processes(GetParam(), "debug_different_shapes");
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, kMismatch) << r.output;
    expect_has(r, "rank 1 is at all_reduce(sum) #1 [float 5] while rank 0 is at all_reduce(sum) "
                  "#1 [float 4]");
  }
}

TEST_P(DiagnosticsMultiProcTest, TorchDistributedDebugDetailAlsoTurnsItOn) {
  ProcessOptions o;
  o.env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL";
  o.env["DDP_DEBUG"] = "";
  const auto results = run_processes(GetParam(), "torch_debug_env_shapes", o);
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, kMismatch) << r.output;
    expect_has(r, "rank 1 is at all_reduce(sum) #1 [float 5]");
  }
}

TEST_P(DiagnosticsMultiProcTest, DebugModePassesMatchingCalls) {
  ddp_test::expect_all_ok(run_processes(GetParam(), "debug_matching_calls"));
}

// ---- Rendezvous ---------------------------------------------------------------------

DDP_SCENARIO(lonely_rank) {
  try {
    ddp::ProcessGroupGuard guard(
        ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(3)));
  } catch (const ddp::TimeoutError& e) {
    std::fprintf(stderr, "TimeoutError: %s\n", e.what());
    return kTimeout;
  }
  return 0;
}

TEST(RendezvousMultiProcTest, ARankThatNeverComesIsNamed) {
  // WORLD_SIZE=3 but only rank 0 starts: it reports whom it waits for, then names both.
  ProcessOptions o;
  o.env["WORLD_SIZE"] = "3";
  o.env["LOCAL_WORLD_SIZE"] = "3";
  o.env["DDP_WAIT_REPORT"] = "1,1";
  const auto results = run_processes(1, "lonely_rank", o);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].exit_code, kTimeout) << results[0].output;
  expect_has(results[0], "for rank(s) 1 and 2 to join (timeout 3 s)");
  expect_has(results[0], "rank(s) 1 and 2 never arrived");
}

// ---- monitored_barrier --------------------------------------------------------------

// Rank 1 is stuck (it waits for a file that rank 0 writes only after its barrier has
// failed), then arrives late and learns it was late.
DDP_SCENARIO(monitored_barrier_stuck_rank) {
  ddp::ProcessGroupGuard guard(
      ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(30)));
  const std::string released = std::string(std::getenv("DDP_TEST_DIR")) + "/released";
  if (ddp::get_rank() == 1) {
    if (!ddp_test::wait_for([&] { return std::ifstream(released).good(); },
                            std::chrono::seconds(30))) {
      return 40;
    }
  }
  try {
    ddp::monitored_barrier(std::chrono::seconds(2));
  } catch (const ddp::TimeoutError& e) {
    std::fprintf(stderr, "TimeoutError: %s\n", e.what());
    if (ddp::get_rank() == 0) std::ofstream(released) << "1";
    return kTimeout;
  }
  return 0;
}

TEST_P(DiagnosticsMultiProcTest, MonitoredBarrierNamesAStuckRank) {
  TempDir dir;
  ProcessOptions o;
  o.env["DDP_TEST_DIR"] = dir.path();
  const auto results = run_processes(GetParam(), "monitored_barrier_stuck_rank", o);
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, kTimeout) << r.output;
    expect_has(r, "monitored_barrier #1 on rank " + std::to_string(r.rank));
    expect_has(r, "rank(s) 1 did not arrive within 2000 ms");
  }
}

DDP_SCENARIO(monitored_barrier_all_arrive) {
  ddp::ProcessGroupGuard guard(
      ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(30)));
  for (int i = 0; i < 3; ++i) ddp::monitored_barrier(std::chrono::seconds(20));
  ddp::monitored_barrier();  // the group's timeout
  return 0;
}

TEST_P(DiagnosticsMultiProcTest, MonitoredBarrierPassesWhenAllArrive) {
  ddp_test::expect_all_ok(run_processes(GetParam(), "monitored_barrier_all_arrive"));
}

// ---- Flight recorder ----------------------------------------------------------------

// Rank 1 skips the second of three all-reduces; without debug mode the backend pairs
// its third with the others' second, and the others wait in their third until the
// timeout. Each rank writes its record (on failure, or at shutdown).
DDP_SCENARIO(flight_recorder_skip) {
  ddp::ProcessGroupGuard guard(ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(3)));
  auto t = at::ones({4});
  try {
    for (int i = 0; i < 3; ++i) {
      if (ddp::get_rank() == 1 && i == 1) continue;
      ddp::all_reduce(t);
    }
  } catch (const ddp::TimeoutError& e) {
    std::fprintf(stderr, "TimeoutError: %s\n", e.what());
    return kTimeout;
  } catch (const ddp::ProcessGroupError& e) {
    std::fprintf(stderr, "ProcessGroupError: %s\n", e.what());
    return kTimeout;
  }
  return 0;
}

TEST_P(DiagnosticsMultiProcTest, FlightRecorderShowsTheCollectiveNotEveryRankEntered) {
  TempDir dir;
  ProcessOptions o;
  o.env["DDP_FLIGHT_RECORDER_DIR"] = dir.path();
  const auto results = run_processes(GetParam(), "flight_recorder_skip", o);
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, r.rank == 1 ? 0 : kTimeout) << r.output;
  }
  std::string report;
  const int code = ddp_test::run_command(std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                                             "/tools/flight_recorder.py " + dir.path(),
                                         &report);
  EXPECT_EQ(code, 1) << report;
  EXPECT_NE(report.find("first collective not every rank entered: #3 all_reduce(sum) [float 4]"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("not by rank(s) 1"), std::string::npos) << report;
}

INSTANTIATE_TEST_SUITE_P(Worlds, DiagnosticsMultiProcTest, ::testing::Values(2, 3));

}  // namespace

}  // namespace diagnostics_test
