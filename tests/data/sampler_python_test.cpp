// DistributedSampler against PyTorch's own torch.utils.data.distributed.DistributedSampler
// and torch.randperm (Debian's python3-torch via DDP_TEST_PYTHON).

#include "data/data_test_util.h"
#include "support/harness.h"

#include <ddp/data/distributed_sampler.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <sstream>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace sampler_python_test {

using ddp::DistributedSampler;
using ddp::DistributedSamplerOptions;
using nlohmann::json;

namespace {

// Runs tests/data/python/sampler_reference.py on `spec`; returns its JSON answer.
json run_reference(const ddp_test::TempDir& dir, const json& spec) {
  const std::string spec_path = dir.file("spec.json");
  const std::string out_path = dir.file("out.json");
  std::ofstream(spec_path) << spec.dump();
  std::string output;
  const int rc = ddp_test::run_command(std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                                           "/tests/data/python/sampler_reference.py " + spec_path +
                                           " " + out_path,
                                       &output);
  EXPECT_EQ(rc, 0) << output;
  std::ifstream in(out_path);
  if (rc != 0 || !in) return json();
  return json::parse(in);
}

}  // namespace

// The whole grid in one Python run: sizes below, at and above the world size, divisible
// or not, both drop_last values, shuffle on and off, several seeds and epochs, every
// rank of 1..4 replicas.
TEST(SamplerPythonTest, MatchesTorchDistributedSamplerOverAGrid) {
  struct SeedEpoch {
    int64_t seed;
    int64_t epoch;
  };
  const std::vector<SeedEpoch> shuffled{
      {0, 0}, {0, 1}, {0, 7}, {42, 0}, {42, 3}, {-5, 2}, {(int64_t{1} << 40) + 3, 1}};
  const std::vector<SeedEpoch> unshuffled{{0, 0}, {42, 3}};
  json spec;
  spec["cases"] = json::array();
  for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 10, 13, 16, 31, 100}) {
    for (int64_t replicas = 1; replicas <= 4; ++replicas) {
      for (bool drop_last : {false, true}) {
        if (drop_last && n < replicas) continue;  // an error here; Python yields nothing
        for (bool shuffle : {false, true}) {
          for (const auto& se : shuffle ? shuffled : unshuffled) {
            for (int64_t rank = 0; rank < replicas; ++rank) {
              spec["cases"].push_back({{"n", n},
                                       {"num_replicas", replicas},
                                       {"rank", rank},
                                       {"shuffle", shuffle},
                                       {"seed", se.seed},
                                       {"epoch", se.epoch},
                                       {"drop_last", drop_last}});
            }
          }
        }
      }
    }
  }
  ddp_test::TempDir dir;
  const json ref = run_reference(dir, spec);
  ASSERT_TRUE(ref.contains("cases"));
  ASSERT_EQ(ref["cases"].size(), spec["cases"].size());
  int failures = 0;
  for (size_t i = 0; i < spec["cases"].size() && failures < 10; ++i) {
    const json& c = spec["cases"][i];
    DistributedSampler s(c["n"].get<size_t>(), DistributedSamplerOptions()
                                                   .num_replicas(c["num_replicas"].get<int64_t>())
                                                   .rank(c["rank"].get<int64_t>())
                                                   .shuffle(c["shuffle"].get<bool>())
                                                   .seed(c["seed"].get<int64_t>())
                                                   .drop_last(c["drop_last"].get<bool>()));
    s.set_epoch(c["epoch"].get<int64_t>());
    const auto expected = ref["cases"][i]["indices"].get<std::vector<size_t>>();
    EXPECT_EQ(s.num_samples(), ref["cases"][i]["len"].get<size_t>()) << c.dump();
    if (s.indices() != expected) {
      ++failures;
      ADD_FAILURE() << "case " << c.dump() << "\n  python: " << json(expected).dump()
                    << "\n  c++:    " << json(s.indices()).dump();
    }
  }
  std::cout << spec["cases"].size() << " cases against torch "
            << ref["torch_version"].get<std::string>() << "\n";
}

// The permutation itself, for small n and for n in the millions (compared in full):
// rank 0 of 1 at epoch 0 hands out exactly torch.randperm(n, generator seeded with seed).
TEST(SamplerPythonTest, RandpermMatchesPythonForSmallAndLargeN) {
  ddp_test::TempDir dir;
  struct Case {
    int64_t n;
    int64_t seed;
  };
  const std::vector<Case> cases{{1, 0},     {2, 3},       {17, 0},      {1000, 99},
                                {65536, 1}, {1 << 20, 0}, {3000017, 7}, {5, -1}};
  json spec;
  spec["cases"] = json::array();
  spec["randperm"] = json::array();
  for (size_t i = 0; i < cases.size(); ++i) {
    spec["randperm"].push_back({{"n", cases[i].n},
                                {"seed", cases[i].seed},
                                {"path", dir.file("perm" + std::to_string(i) + ".bin")}});
  }
  const json ref = run_reference(dir, spec);
  ASSERT_TRUE(ref.contains("cases"));
  for (size_t i = 0; i < cases.size(); ++i) {
    const DistributedSampler s(static_cast<size_t>(cases[i].n),
                               DistributedSamplerOptions().num_replicas(1).rank(0).seed(
                                   cases[i].seed));
    std::ifstream in(dir.file("perm" + std::to_string(i) + ".bin"), std::ios::binary);
    std::vector<int64_t> python(static_cast<size_t>(cases[i].n));
    in.read(reinterpret_cast<char*>(python.data()),
            static_cast<std::streamsize>(python.size() * sizeof(int64_t)));
    ASSERT_TRUE(in.good()) << "short file for n=" << cases[i].n;
    size_t mismatches = 0;
    size_t first = 0;
    for (size_t k = 0; k < python.size(); ++k) {
      if (static_cast<int64_t>(s.indices()[k]) != python[k] && mismatches++ == 0) first = k;
    }
    EXPECT_EQ(mismatches, 0u) << "n=" << cases[i].n << " seed=" << cases[i].seed
                              << ": first difference at " << first;
  }
}

}  // namespace sampler_python_test
