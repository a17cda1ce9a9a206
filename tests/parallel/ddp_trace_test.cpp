// The trace: one Chrome trace-event JSON file per rank, valid after every backward,
// with forward, backward, each bucket's all-reduce, the wait and user scopes.

#include "parallel/ddp_test_util.h"

#include <ddp/parallel/trace.h>

#include <nlohmann/json.hpp>
#include <torch/optim/sgd.h>

#include <fstream>
#include <map>
#include <set>
#include <sys/stat.h>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace ddp_trace_test {

using ddp_test::options_for;
using ddp_test::run_thread_groups;

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  return nlohmann::json::parse(in);  // throws on invalid JSON
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

TEST(TraceTest, WritesValidJsonPerRankWithTheExpectedEvents) {
  ddp_test::TempDir dir;
  const int world = 2, iterations = 3;
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp model;
    auto dmodel = ddp::DistributedDataParallel(
        model, options_for(pg).trace_path(dir.file("trace.json")).bucket_cap_mb(1e-6));
    torch::optim::SGD opt(model->parameters(), 0.1);
    for (int it = 0; it < iterations; ++it) {
      opt.zero_grad();
      dmodel(ddp_test::randn({4, 8}, it)).sum().backward();
      ddp::trace::Scope step(dmodel, "optimizer.step");
      opt.step();
    }
    {
      auto scope = dmodel->trace_scope("checkpoint");  // the member form
    }
    // Valid while training goes on: every backward leaves a complete file.
    read_json(dir.file("trace.rank" + std::to_string(pg.rank()) + ".json"));
  });
  for (int r = 0; r < world; ++r) {
    const std::string path = dir.file("trace.rank" + std::to_string(r) + ".json");
    const auto events = read_json(path);
    ASSERT_TRUE(events.is_array());
    std::map<std::string, int> count;
    std::set<int> bucket_tracks;
    for (const auto& e : events) {
      ASSERT_TRUE(e.contains("name") && e.contains("ph") && e.contains("pid")) << e.dump();
      EXPECT_EQ(e["pid"].get<int>(), r);
      if (e["ph"] == "X") {
        EXPECT_TRUE(e["ts"].is_number_integer()) << e.dump();
        EXPECT_GE(e["dur"].get<int64_t>(), 0) << e.dump();
        ++count[e["name"].get<std::string>()];
        if (e["name"] == "all_reduce") {
          bucket_tracks.insert(e["tid"].get<int>());
          EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0);
        }
      } else {
        EXPECT_EQ(e["ph"], "M") << e.dump();
      }
    }
    EXPECT_EQ(count["forward"], iterations) << path;
    EXPECT_EQ(count["backward"], iterations) << path;
    EXPECT_EQ(count["backward.wait"], iterations) << path;
    EXPECT_EQ(count["optimizer.step"], iterations) << path;
    EXPECT_EQ(count["checkpoint"], 1) << path;
    // 6 parameters: PyTorch's single initial bucket in the first iteration, then one
    // bucket each, each on its own track.
    EXPECT_EQ(count["all_reduce"], 1 + 6 * (iterations - 1)) << path;
    EXPECT_EQ(bucket_tracks.size(), 6u) << path;
  }
}

TEST(TraceTest, RankPlaceholderAndNoFileWhenOff) {
  ddp_test::TempDir dir;
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp a, b;
    auto traced =
        ddp::DistributedDataParallel(a, options_for(pg).trace_path(dir.file("run-{rank}.trace")));
    auto untraced = ddp::DistributedDataParallel(b, options_for(pg));
    traced(ddp_test::randn({2, 8}, 1)).sum().backward();
    untraced(ddp_test::randn({2, 8}, 1)).sum().backward();
    ddp::trace::Scope nothing(untraced, "ignored");  // tracing off: a no-op
  });
  EXPECT_TRUE(exists(dir.file("run-0.trace")));
  EXPECT_TRUE(exists(dir.file("run-1.trace")));
  std::string listing;
  ddp_test::run_command("ls " + dir.path(), &listing);
  EXPECT_EQ(listing, "run-0.trace\nrun-1.trace\n");
  read_json(dir.file("run-0.trace"));
}

TEST(TraceTest, UnwritablePathIsAClearError) {
  run_thread_groups(1, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp model;
    const std::string msg = ddp_test::error_of([&] {
      ddp::DistributedDataParallel(model,
                                   options_for(pg).trace_path("/nonexistent-dir/trace.json"));
    });
    EXPECT_NE(msg.find("cannot open the trace file '/nonexistent-dir/trace.rank0.json'"),
              std::string::npos)
        << msg;
  });
}

}  // namespace ddp_trace_test
