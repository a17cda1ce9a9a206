// DistributedSampler: split, shuffle, resume and errors. The order is checked against
// Python itself in sampler_python_test.cpp; here against its defining properties.

#include "data/data_test_util.h"
#include "support/harness.h"

#include <ddp/distributed/process_group.h>
#include <ddp/data/distributed_sampler.h>

#include <gtest/gtest.h>
#include <torch/data.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace sampler_test {

using ddp::DistributedSampler;
using ddp::DistributedSamplerOptions;
using ddp_test::error_of;

namespace {

DistributedSamplerOptions opts(int64_t replicas, int64_t rank) {
  return DistributedSamplerOptions().num_replicas(replicas).rank(rank);
}

std::vector<size_t> drain(DistributedSampler& sampler, size_t batch_size) {
  std::vector<size_t> out;
  while (auto batch = sampler.next(batch_size)) {
    EXPECT_LE(batch->size(), batch_size);
    out.insert(out.end(), batch->begin(), batch->end());
  }
  return out;
}

}  // namespace

// Every rank gets ceil(n / R) indices; together they are the permutation padded by its
// own head, interleaved by rank (Python's indices[rank:total:R]).
TEST(SamplerTest, RanksTogetherCoverThePaddedPermutation) {
  for (size_t n : {1, 2, 5, 8, 11}) {
    for (int64_t replicas = 1; replicas <= 4; ++replicas) {
      const DistributedSampler one(n, opts(1, 0).seed(9));  // the permutation itself
      std::vector<size_t> padded(one.indices());
      const size_t total = (n + replicas - 1) / replicas * replicas;
      for (size_t i = n; i < total; ++i) padded.push_back(padded[i % n]);
      for (int64_t r = 0; r < replicas; ++r) {
        const DistributedSampler s(n, opts(replicas, r).seed(9));
        ASSERT_EQ(s.num_samples(), (n + replicas - 1) / replicas) << n << " " << replicas;
        ASSERT_EQ(s.total_size(), total);
        for (size_t k = 0; k < s.num_samples(); ++k) {
          EXPECT_EQ(s.indices()[k], padded[r + k * replicas])
              << "n=" << n << " R=" << replicas << " rank=" << r << " k=" << k;
        }
      }
    }
  }
}

TEST(SamplerTest, DropLastTruncatesAndNeverRepeats) {
  const size_t n = 11;
  const int64_t replicas = 3;
  std::multiset<size_t> seen;
  for (int64_t r = 0; r < replicas; ++r) {
    const DistributedSampler s(n, opts(replicas, r).drop_last(true));
    EXPECT_EQ(s.num_samples(), 3u);  // floor(11 / 3)
    seen.insert(s.indices().begin(), s.indices().end());
  }
  EXPECT_EQ(seen.size(), 9u);
  EXPECT_EQ(std::set<size_t>(seen.begin(), seen.end()).size(), 9u);
}

TEST(SamplerTest, WithoutShuffleRanksTakeEveryRthIndex) {
  const DistributedSampler s(10, opts(3, 1).shuffle(false));
  EXPECT_EQ(s.indices(), (std::vector<size_t>{1, 4, 7, 0}));
  // Padding wraps to the head (10 -> 12): rank 1 ends with 0, rank 2 with 1.
  const DistributedSampler last(10, opts(3, 2).shuffle(false));
  EXPECT_EQ(last.indices(), (std::vector<size_t>{2, 5, 8, 1}));
}

TEST(SamplerTest, SetEpochReshufflesTheSameWayOnEveryRank) {
  const size_t n = 64;
  DistributedSampler a(n, opts(2, 0).seed(5));
  DistributedSampler b(n, opts(2, 1).seed(5));
  const auto epoch0 = a.indices();
  for (int64_t epoch : {1, 2, 7}) {
    a.set_epoch(epoch);
    b.set_epoch(epoch);
    std::set<size_t> all(a.indices().begin(), a.indices().end());
    all.insert(b.indices().begin(), b.indices().end());
    EXPECT_EQ(all.size(), n) << "the ranks' shares overlap in epoch " << epoch;
    EXPECT_NE(a.indices(), epoch0) << "epoch " << epoch << " did not reshuffle";
  }
  a.set_epoch(0);
  EXPECT_EQ(a.indices(), epoch0);
  // Another seed, another order.
  const DistributedSampler c(n, opts(2, 0).seed(6));
  EXPECT_NE(c.indices(), epoch0);
}

TEST(SamplerTest, NextHandsOutBatchesThenEndsTheEpoch) {
  DistributedSampler s(10, opts(2, 0));
  EXPECT_EQ(drain(s, 2), s.indices());
  EXPECT_FALSE(s.next(2).has_value());
  EXPECT_EQ(s.position(), s.num_samples());
  s.reset();
  EXPECT_EQ(s.position(), 0u);
  EXPECT_EQ(drain(s, 3), s.indices());
  EXPECT_NE(error_of([&] { s.next(0); }).find("batch_size must be > 0"), std::string::npos);
}

TEST(SamplerTest, ResetWithNewSizeResizes) {
  DistributedSampler s(10, opts(2, 1).shuffle(false));
  s.reset(7);
  EXPECT_EQ(s.dataset_size(), 7u);
  EXPECT_EQ(s.indices(), (std::vector<size_t>{1, 3, 5, 0}));
}

// make_data_loader copies the sampler; copies share state, so set_epoch on the
// caller's sampler reaches the loader's.
TEST(SamplerTest, DataLoaderFollowsSetEpoch) {
  const size_t n = 20;
  DistributedSampler sampler(n, opts(2, 1).seed(3));
  auto loader =
      torch::data::make_data_loader(ddp_test::IndexDataset(n).map(
                                        torch::data::transforms::Stack<>()),
                                    sampler, torch::data::DataLoaderOptions().batch_size(4));
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    sampler.set_epoch(epoch);
    std::vector<size_t> got;
    for (auto& batch : *loader) {
      for (int64_t i = 0; i < batch.data.size(0); ++i) {
        got.push_back(static_cast<size_t>(batch.data[i].item<int64_t>()));
      }
    }
    EXPECT_EQ(got, sampler.indices()) << "epoch " << epoch;
  }
}

// The loader's begin() calls reset(); after a restore, that must not rewind.
TEST(SamplerTest, ResumesMidEpochThroughADataLoader) {
  const size_t n = 30;
  DistributedSampler first(n, opts(3, 2).seed(11));
  first.set_epoch(4);
  first.next(3);
  first.next(3);
  const ddp::DistributedSamplerState saved = first.state();
  EXPECT_EQ(saved.epoch, 4);
  EXPECT_EQ(saved.position, 6);
  const std::vector<size_t> rest(first.indices().begin() + 6, first.indices().end());

  DistributedSampler second(n, opts(3, 2).seed(11));
  second.load_state(saved);
  second.set_epoch(4);  // the training loop's call for the restored epoch keeps the position
  auto loader =
      torch::data::make_data_loader(ddp_test::IndexDataset(n).map(
                                        torch::data::transforms::Stack<>()),
                                    second, torch::data::DataLoaderOptions().batch_size(3));
  std::vector<size_t> got;
  for (auto& batch : *loader) {
    for (int64_t i = 0; i < batch.data.size(0); ++i) {
      got.push_back(static_cast<size_t>(batch.data[i].item<int64_t>()));
    }
  }
  EXPECT_EQ(got, rest);
  // The next epoch starts from its beginning.
  second.set_epoch(5);
  EXPECT_EQ(second.position(), 0u);
  EXPECT_EQ(drain(second, 100).size(), second.num_samples());
}

TEST(SamplerTest, SetEpochToAnotherEpochAfterRestoreStartsFresh) {
  DistributedSampler s(12, opts(2, 0));
  ddp::DistributedSamplerState st = s.state();
  st.epoch = 2;
  st.position = 3;
  s.load_state(st);
  s.set_epoch(3);
  EXPECT_EQ(s.position(), 0u);
  EXPECT_EQ(s.epoch(), 3);
}

TEST(SamplerTest, SavesAndLoadsThroughLibTorchArchives) {
  DistributedSampler a(50, opts(4, 3).seed(2).drop_last(true));
  a.set_epoch(9);
  a.next(5);
  torch::serialize::OutputArchive out;
  a.save(out);
  std::stringstream buffer;
  out.save_to(buffer);

  torch::serialize::InputArchive in;
  in.load_from(buffer);
  DistributedSampler b(50, opts(4, 3).seed(2).drop_last(true));
  b.load(in);
  EXPECT_EQ(b.epoch(), 9);
  EXPECT_EQ(b.position(), 5u);
  const std::vector<size_t> rest(a.indices().begin() + 5, a.indices().end());
  EXPECT_EQ(drain(b, 4), rest);
}

TEST(SamplerTest, MidEpochStateFromOtherSettingsIsRefused) {
  DistributedSampler a(40, opts(2, 0).seed(1));
  a.next(4);
  const auto st = a.state();
  DistributedSampler other_seed(40, opts(2, 0).seed(2));
  const std::string msg = error_of([&] { other_seed.load_state(st); });
  EXPECT_NE(msg.find("seed=1 but this sampler has seed=2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("position 4 of epoch 0"), std::string::npos) << msg;
  EXPECT_EQ(other_seed.position(), 0u) << "a refused state must change nothing";

  DistributedSampler other_world(40, opts(4, 0).seed(1));
  EXPECT_NE(error_of([&] {
              other_world.load_state(st);
            }).find("num_replicas=2 but this sampler has num_replicas=4"),
            std::string::npos);
  // At an epoch boundary only the epoch matters.
  auto boundary = st;
  boundary.position = 0;
  boundary.epoch = 3;
  other_world.load_state(boundary);
  EXPECT_EQ(other_world.epoch(), 3);
}

TEST(SamplerTest, ErrorsSayWhatWasExpectedAndWhatToDo) {
  std::string msg = error_of([] { DistributedSampler(10, opts(2, 2)); });
  EXPECT_NE(msg.find("rank must be in 0..1 (num_replicas=2), but got 2"), std::string::npos) << msg;
  msg = error_of([] { DistributedSampler(10, opts(2, -1)); });
  EXPECT_NE(msg.find("but got -1"), std::string::npos) << msg;
  msg = error_of([] { DistributedSampler(0, opts(2, 0)); });
  EXPECT_NE(msg.find("the dataset is empty (dataset_size=0)"), std::string::npos) << msg;
  msg = error_of([] { DistributedSampler(3, opts(4, 0).drop_last(true)); });
  EXPECT_NE(msg.find("drop_last=true with dataset_size=3 < num_replicas=4"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("Use drop_last=false"), std::string::npos) << msg;
  msg = error_of([] { DistributedSampler(10, opts(0, 0)); });
  EXPECT_NE(msg.find("num_replicas must be >= 1, but got 0"), std::string::npos) << msg;
  // Without drop_last a tiny dataset is padded, as in Python.
  const DistributedSampler tiny(3, opts(4, 3).shuffle(false));
  EXPECT_EQ(tiny.indices(), (std::vector<size_t>{0}));
}

TEST(SamplerTest, WithoutProcessGroupNumReplicasMustBeGiven) {
  ASSERT_FALSE(ddp::is_initialized());
  const std::string msg = error_of([] { DistributedSampler(10); });
  EXPECT_NE(msg.find("num_replicas is unset and no default process group is initialised"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("ddp::init_process_group()"), std::string::npos) << msg;
}

TEST(SamplerTest, DefaultsComeFromTheDefaultProcessGroup) {
  ddp_test::TempDir dir;
  ddp::ProcessGroupGuard guard(ddp_test::file_init(dir, /*rank=*/0, /*world=*/1));
  const DistributedSampler s(10);
  EXPECT_EQ(s.num_replicas(), 1);
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.num_samples(), 10u);
  // Explicit values still win.
  const DistributedSampler t(10, DistributedSamplerOptions().num_replicas(5).rank(4));
  EXPECT_EQ(t.num_replicas(), 5);
}

// Each rank of a real group builds its sampler from the group; the shares are disjoint
// and cover the dataset.
TEST(SamplerTest, RanksOfAGroupAgree) {
  const size_t n = 24;
  std::vector<std::vector<size_t>> shares(3);
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    DistributedSampler s(n, opts(pg.size(), pg.rank()).seed(77));
    s.set_epoch(2);
    // What every rank holds, gathered through the group, as a real job would see it.
    std::string mine(reinterpret_cast<const char*>(s.indices().data()),
                     s.indices().size() * sizeof(size_t));
    const auto all = pg.all_gather_bytes(mine);
    std::set<size_t> seen;
    for (const auto& bytes : all) {
      const auto* p = reinterpret_cast<const size_t*>(bytes.data());
      seen.insert(p, p + bytes.size() / sizeof(size_t));
    }
    EXPECT_EQ(seen.size(), n);
    shares[pg.rank()] = s.indices();
  });
  EXPECT_NE(shares[0], shares[1]);
}

}  // namespace sampler_test
