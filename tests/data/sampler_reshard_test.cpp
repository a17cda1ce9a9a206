// DistributedSampler resumed mid-epoch with another number of ranks (Note [Re-sharding an
// epoch] in src/data/reshard.h): checked against a hand-computed split, against the
// property that defines it (every sample of the epoch once), and through checkpoints
// saved by one number of ranks and loaded by another.

#include "support/harness.h"

#include <ddp/data/distributed_sampler.h>
#include <ddp/distributed/process_group.h>
#include <ddp/serialize/checkpoint.h>

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace sampler_reshard_test {

using ddp::DistributedSampler;
using ddp::DistributedSamplerOptions;
using ddp::DistributedSamplerStage;
using ddp_test::error_of;

namespace {

DistributedSamplerOptions layout(int64_t replicas, int64_t rank, bool shuffle = true,
                                 bool drop_last = false) {
  return DistributedSamplerOptions()
      .num_replicas(replicas)
      .rank(rank)
      .shuffle(shuffle)
      .seed(7)
      .drop_last(drop_last);
}

std::vector<size_t> rest_of(DistributedSampler& s) {
  std::vector<size_t> out;
  while (auto b = s.next(3)) out.insert(out.end(), b->begin(), b->end());
  return out;
}

// What the ranks of one layout hand out: the first positions[r] of each rank's share.
std::multiset<size_t> seen_by(const std::vector<std::vector<size_t>>& shares,
                              const std::vector<int64_t>& positions) {
  std::multiset<size_t> seen;
  for (size_t r = 0; r < shares.size(); ++r) {
    seen.insert(shares[r].begin(), shares[r].begin() + positions[r]);
  }
  return seen;
}

}  // namespace

TEST(SamplerReshardTest, HandComputedSplit) {
  // 10 samples in order over 3 ranks, padded to 12: rank 0 {0,3,6,9}, 1 {1,4,7,0},
  // 2 {2,5,8,1}. After two each, 6..9 are left (the padding 0 and 1 was seen already);
  // two ranks then take 6,8 and 7,9.
  const std::vector<DistributedSamplerStage> stages = {{3, {2, 2, 2}}};
  DistributedSampler a(10, layout(2, 0, /*shuffle=*/false));
  DistributedSampler b(10, layout(2, 1, /*shuffle=*/false));
  a.reshard(0, stages);
  b.reshard(0, stages);
  EXPECT_EQ(rest_of(a), (std::vector<size_t>{6, 8}));
  EXPECT_EQ(rest_of(b), (std::vector<size_t>{7, 9}));
  EXPECT_EQ(a.num_samples(), 2u);
}

TEST(SamplerReshardTest, EverySampleOfTheEpochOnceAcrossTwoChanges) {
  for (bool drop_last : {false, true}) {
    for (size_t n : {23u, 40u, 101u}) {
      SCOPED_TRACE("n " + std::to_string(n) + " drop_last " + std::to_string(drop_last));
      std::mt19937 rng(static_cast<unsigned>(n));
      std::multiset<size_t> seen;
      std::vector<DistributedSamplerStage> stages;
      size_t left = n;  // samples of the epoch not yet handed out (nor dropped)
      for (int64_t replicas : {3, 2, 4}) {
        std::vector<std::vector<size_t>> shares;
        for (int64_t r = 0; r < replicas; ++r) {
          DistributedSampler s(n, layout(replicas, r, true, drop_last));
          s.set_epoch(5);
          if (!stages.empty()) s.reshard(5, stages);
          shares.push_back(s.indices());
        }
        const size_t per = shares[0].size();
        const size_t slots = per * static_cast<size_t>(replicas);
        EXPECT_EQ(per, drop_last ? left / replicas : (left + replicas - 1) / replicas);
        if (replicas == 4) {  // the last layout runs to the end of the epoch
          std::multiset<size_t> all = seen;
          for (const auto& share : shares) all.insert(share.begin(), share.end());
          const std::set<size_t> distinct(all.begin(), all.end());
          // Without drop_last nothing is lost, and the only repeats are the last
          // layout's padding; with it nothing repeats, and only the remainders are lost.
          if (!drop_last) EXPECT_EQ(distinct.size(), n);
          EXPECT_EQ(all.size() - distinct.size(), drop_last ? 0u : slots - left);
          break;
        }
        // Each rank stops somewhere short of its share's end (not in lockstep).
        std::vector<int64_t> positions;
        for (int64_t r = 0; r < replicas; ++r) {
          positions.push_back(static_cast<int64_t>(rng() % per));
        }
        const std::multiset<size_t> now = seen_by(shares, positions);
        for (size_t i : now) EXPECT_EQ(seen.count(i), 0u) << "sample " << i << " seen twice";
        seen.insert(now.begin(), now.end());
        left = std::min(left, slots) - now.size();
        stages.push_back({replicas, positions});
      }
    }
  }
}

TEST(SamplerReshardTest, NextEpochIsPythonsOrderAgain) {
  DistributedSampler s(50, layout(2, 1));
  s.reshard(3, {{3, {4, 5, 4}}});
  EXPECT_EQ(s.epoch(), 3);
  s.set_epoch(4);
  DistributedSampler fresh(50, layout(2, 1));
  fresh.set_epoch(4);
  EXPECT_EQ(s.indices(), fresh.indices());
  EXPECT_TRUE(s.state().earlier_stages.empty());
}

TEST(SamplerReshardTest, StateAndArchivesKeepTheEarlierLayouts) {
  DistributedSampler s(37, layout(2, 0));
  s.reshard(1, {{3, {2, 3, 2}}, {4, {1, 0, 1, 1}}});
  s.set_epoch(1);  // the usual loop: keeps the re-sharded epoch
  s.next(2);
  torch::serialize::OutputArchive out;
  s.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);

  DistributedSampler loaded(37, layout(2, 0));
  torch::serialize::InputArchive in;
  std::istringstream read(bytes.str());
  in.load_from(read);
  loaded.load(in);
  EXPECT_EQ(loaded.indices(), s.indices());
  EXPECT_EQ(loaded.position(), 2u);
  EXPECT_EQ(rest_of(loaded), rest_of(s));

  DistributedSampler by_state(37, layout(2, 0));
  by_state.load_state(s.state());
  EXPECT_EQ(by_state.indices(), s.indices());
}

TEST(SamplerReshardTest, PositionsThatDoNotFitAreRefused) {
  DistributedSampler s(20, layout(2, 0));
  std::string msg = error_of([&] { s.reshard(0, {{3, {1, 2}}}); });
  EXPECT_NE(msg.find("has num_replicas=3 but 2 positions"), std::string::npos) << msg;
  msg = error_of([&] { s.reshard(0, {{3, {1, 8, 1}}}); });
  EXPECT_NE(msg.find("rank 1 has position 8; expected 0..7"), std::string::npos) << msg;
}

// ---- Through checkpoints: saved by three ranks, loaded by two ----------------------

TEST(SamplerReshardTest, CheckpointFromThreeRanksResumesOnTwo) {
  ddp_test::TempDir out;
  const size_t n = 31;
  std::multiset<size_t> seen;
  std::mutex mu;
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    torch::nn::Linear net(2, 2);
    DistributedSampler s(n, layout(3, pg.rank()));
    s.set_epoch(2);
    auto got = s.next(static_cast<size_t>(2 + pg.rank()));  // not in lockstep
    {
      std::lock_guard<std::mutex> lock(mu);
      seen.insert(got->begin(), got->end());
    }
    ddp::save_checkpoint(out.file("c.pt"), ddp::Checkpoint(*net).sampler(&s).epoch(2).process_group(
                                               ddp_test::borrow(pg)));
  });
  std::multiset<size_t> rest;
  ddp_test::run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    torch::nn::Linear net(2, 2);
    DistributedSampler s(n, layout(2, pg.rank()));
    ddp::Checkpoint ck(*net);
    ck.sampler(&s).process_group(ddp_test::borrow(pg));
    ddp::load_checkpoint(out.file("c.pt"), ck);
    s.set_epoch(ck.epoch());
    const std::vector<size_t> mine = rest_of(s);
    std::lock_guard<std::mutex> lock(mu);
    rest.insert(mine.begin(), mine.end());
  });
  std::multiset<size_t> all = seen;
  all.insert(rest.begin(), rest.end());
  const std::set<size_t> distinct(all.begin(), all.end());
  EXPECT_EQ(distinct.size(), n);
  for (size_t i : rest) EXPECT_EQ(seen.count(i), 0u) << "sample " << i << " seen twice";
  // 31 - 9 seen = 22 left, 11 per rank: no padding needed.
  EXPECT_EQ(rest.size(), 22u);
}

}  // namespace sampler_reshard_test
