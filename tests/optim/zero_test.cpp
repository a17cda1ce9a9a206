// ZeroRedundancyOptimizer against DistributedDataParallel with the unsharded optimizer:
// the same parameters, bit for bit, on every rank; 1/world_size of the state per rank.

#include "optim/zero_test_util.h"
#include "support/util.h"

#include "optim/partition.h"

#include <torch/serialize/output-archive.h>

#include <numeric>
#include <tuple>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace zero_test {

using ddp::ParameterSync;
using ddp::ZeroRedundancyOptimizer;
using ddp::ZeroRedundancyOptimizerOptions;
using ddp_test::borrow;
using ddp_test::run_thread_groups;

namespace {

constexpr int64_t kSteps = 20;

ZeroRedundancyOptimizerOptions zero_options(ddp::ProcessGroup& pg,
                                            ParameterSync sync = ParameterSync::kAllGather) {
  return ZeroRedundancyOptimizerOptions().process_group(borrow(pg)).parameter_sync(sync);
}

ddp::DistributedDataParallelOptions ddp_options(ddp::ProcessGroup& pg) {
  return ddp::DistributedDataParallelOptions().process_group(borrow(pg));
}

}  // namespace

// ---- Partition -------------------------------------------------------------------------

// PyTorch's greedy assignment, worked by hand.
TEST(ZeroPartitionTest, GreedyLargestFirstToTheLightestRank) {
  // Sorted: 10, 5, 5, 3, 1. Totals [0,0]: 10->0 [10,0]; 5->1 [10,5]; 5->1 [10,10];
  // 3->0 (tie, lowest rank) [13,10]; 1->1 [13,11]. Owners in the original order.
  EXPECT_EQ(ddp::detail::partition_parameters({{1, 10, 5, 3, 5}}, 2),
            (std::vector<int>{1, 0, 1, 0, 1}));
  // Totals carry over from group to group: group 1's 4 goes to rank 1 (10 vs 0 + 0).
  EXPECT_EQ(ddp::detail::partition_parameters({{10}, {4, 4, 4}}, 2),
            (std::vector<int>{0, 1, 1, 1}));
  // More ranks than parameters: the extra ranks own nothing.
  EXPECT_EQ(ddp::detail::partition_parameters({{7, 7}}, 3), (std::vector<int>{0, 1}));
  EXPECT_EQ(ddp::detail::partition_parameters({{}}, 2), (std::vector<int>{}));
}

TEST(ZeroPartitionTest, TotalsDifferByAtMostTheLargestParameter) {
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < 40; ++i) sizes.push_back((i * 37) % 101 + 1);
  for (int world : {2, 3, 4, 7}) {
    const auto owners = ddp::detail::partition_parameters({sizes}, world);
    std::vector<int64_t> totals(static_cast<size_t>(world), 0);
    for (size_t i = 0; i < sizes.size(); ++i) totals[static_cast<size_t>(owners[i])] += sizes[i];
    const auto [lo, hi] = std::minmax_element(totals.begin(), totals.end());
    EXPECT_LE(*hi - *lo, 101) << "world " << world;
  }
}

// ---- Equivalence with the unsharded optimizer ------------------------------------------

class ZeroEquivalenceTest
    : public ::testing::TestWithParam<std::tuple<std::string, int, ParameterSync>> {};

// 20 steps of DDP + ZeRO and of DDP + the plain optimizer from the same weights on the
// same batches, with the lr halved half way through param_groups() (as an LR scheduler
// does): the same bits in every parameter, and every rank holds the same parameters.
void expect_equivalent(const std::string& kind, ParameterSync sync, ddp::ProcessGroup& pg) {
  auto plain_model = zero_test::make_wide(7);
  auto zero_model = zero_test::make_wide(7);
  auto plain_ddp = ddp::DistributedDataParallel(plain_model, ddp_options(pg));
  auto zero_ddp = ddp::DistributedDataParallel(zero_model, ddp_options(pg));
  auto plain = zero_test::make_plain(kind, plain_model->parameters());
  auto zero = zero_test::make_zero(kind, zero_model->parameters(), zero_options(pg, sync));
  std::string first_split;
  for (int64_t step = 0; step < kSteps; ++step) {
    if (step == kSteps / 2) {
      for (torch::optim::Optimizer* opt :
           {plain.get(), static_cast<torch::optim::Optimizer*>(zero.get())}) {
        auto& options = opt->param_groups()[0].options();
        options.set_lr(options.get_lr() / 2);
      }
    }
    zero_test::backward_step(plain_ddp, *plain, pg.rank(), step);
    zero_test::backward_step(zero_ddp, *zero, pg.rank(), step);
    // Where the two runs part, if they do: in the gradients (DDP) or in the update.
    if (first_split.empty()) {
      const std::string grad = zero_test::first_difference(*zero_model, *plain_model, true);
      if (!grad.empty())
        first_split = grad + "'s gradient differs first, at step " + std::to_string(step);
    }
    plain->step();
    zero->step();
    if (first_split.empty()) {
      const std::string param = zero_test::first_difference(*zero_model, *plain_model, false);
      if (!param.empty()) {
        first_split = param + " differs first, after the update of step " + std::to_string(step) +
                      " (the gradients were equal)";
      }
    }
  }
  zero_test::expect_same_params(*zero_model, *plain_model,
                                kind + " at rank " + std::to_string(pg.rank()) + " (" +
                                    (first_split.empty() ? "never split" : first_split) + ")");
  zero_test::expect_same_on_every_rank(pg, *zero_model);
  zero_test::expect_same_on_every_rank(pg, *plain_model);
}

TEST_P(ZeroEquivalenceTest, TwentyStepsMatchThePlainOptimizerBitForBit) {
  const auto [kind, world, sync] = GetParam();
  run_thread_groups(world, [&, kind = kind, sync = sync](ddp::ProcessGroup& pg) {
    expect_equivalent(kind, sync, pg);
  });
}

// On groups made by new_subgroups: two 3-rank jobs at once, the second on global ranks
// 3 to 5 (the broadcasts' roots are group ranks there).
TEST(ZeroSubgroupTest, TwoJobsOnSubgroupsMatchThePlainOptimizer) {
  for (ParameterSync sync : {ParameterSync::kBroadcast, ParameterSync::kAllGather}) {
    ddp_test::run_subgroup_copies(3, [&](ddp::ProcessGroup& pg) {
      expect_equivalent("adam", sync, pg);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, ZeroEquivalenceTest,
    ::testing::Combine(::testing::Values("sgd", "adam", "adamw", "amsgrad"),
                       ::testing::Values(1, 2, 3),
                       ::testing::Values(ParameterSync::kAllGather, ParameterSync::kBroadcast)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_world" + std::to_string(std::get<1>(info.param)) +
             (std::get<2>(info.param) == ParameterSync::kAllGather ? "_allgather" : "_broadcast");
    });

// Two param groups with their own options, one of them with parameters of two dtypes
// (two sync buckets): still the plain optimizer's bits.
TEST(ZeroEquivalenceGroupsTest, ParamGroupsAndTwoDtypes) {
  run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    auto make = [&](std::vector<at::Tensor>& params) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
      params = {at::randn({40, 3}, gen), at::randn({7}, gen),
                at::randn({9, 9}, gen).to(at::kDouble), at::randn({2}, gen)};
      for (auto& p : params) p.requires_grad_(true);
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(std::vector<at::Tensor>{params[0], params[1]});
      groups.emplace_back(std::vector<at::Tensor>{params[2], params[3]},
                          std::make_unique<torch::optim::AdamOptions>(
                              torch::optim::AdamOptions(0.003).weight_decay(0.1)));
      return groups;
    };
    std::vector<at::Tensor> a, b;
    torch::optim::Adam plain(make(a), torch::optim::AdamOptions(0.02));
    ZeroRedundancyOptimizer zero(make(b), torch::optim::AdamOptions(0.02), zero_options(pg));
    ASSERT_EQ(zero.owners().size(), 4u);
    for (int64_t step = 0; step < 5; ++step) {
      for (auto* params : {&a, &b}) {
        for (size_t i = 0; i < params->size(); ++i) {
          // The same gradient on every rank, as DDP would leave it.
          (*params)[i].mutable_grad() =
              at::full_like((*params)[i], 0.1 * static_cast<double>(i + 1 + step)).sin();
        }
      }
      plain.step();
      zero.step();
    }
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(ddp_test::same_bits(a[i], b[i])) << "parameter " << i;
    }
    EXPECT_DOUBLE_EQ(zero.local_optimizer().param_groups()[1].options().get_lr(), 0.003);
  });
}

// ---- Memory ----------------------------------------------------------------------------

// Each rank holds at most its share of the unsharded optimizer's state plus one
// parameter's, and the shards add up to exactly the unsharded state.
TEST(ZeroMemoryTest, StatePerRankIsOneShard) {
  for (int world : {2, 3}) {
    std::vector<int64_t> bytes(static_cast<size_t>(world), 0);
    int64_t total = 0;
    int64_t largest = 0;
    run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
      auto model = zero_test::make_wide(3, /*width=*/64);
      auto dmodel = ddp::DistributedDataParallel(model, ddp_options(pg));
      auto zero = zero_test::make_zero("adam", model->parameters(), zero_options(pg));
      zero_test::train_step(dmodel, *zero, pg.rank(), 0);
      bytes[static_cast<size_t>(pg.rank())] = zero->local_state_bytes();
      if (pg.rank() == 0) {
        auto plain_model = zero_test::make_wide(3, /*width=*/64);
        auto plain = zero_test::make_plain("adam", plain_model->parameters());
        for (auto& p : plain_model->parameters()) p.mutable_grad() = at::ones_like(p);
        plain->step();
        total = ddp::optimizer_state_bytes(*plain);
        for (auto& p : plain_model->parameters()) {
          largest = std::max<int64_t>(largest, 2 * p.numel() * 4);  // exp_avg, exp_avg_sq
        }
      }
    });
    EXPECT_EQ(std::accumulate(bytes.begin(), bytes.end(), int64_t{0}), total);
    for (int r = 0; r < world; ++r) {
      EXPECT_LE(bytes[static_cast<size_t>(r)], total / world + largest)
          << "rank " << r << " of " << world << " holds " << bytes[static_cast<size_t>(r)]
          << " bytes of " << total;
      EXPECT_GT(bytes[static_cast<size_t>(r)], 0) << "rank " << r;
    }
  }
}

// ---- Bad input -------------------------------------------------------------------------

TEST(ZeroErrorsTest, ParametersThatDifferAcrossRanksAreNamed) {
  std::vector<std::string> errors(2);
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    std::vector<at::Tensor> params{at::zeros({4, 4}), at::zeros({3}),
                                   at::zeros({pg.rank() == 1 ? 6 : 5})};
    for (auto& p : params) p.requires_grad_(true);
    errors[static_cast<size_t>(pg.rank())] = ddp_test::error_of([&] {
      try {
        ZeroRedundancyOptimizer(params, torch::optim::AdamOptions(0.1), zero_options(pg));
      } catch (const ddp::MismatchError&) {
        throw;
      } catch (...) {
        ADD_FAILURE() << "expected ddp::MismatchError";
        throw;
      }
    });
  });
  for (const auto& e : errors) {
    EXPECT_ERROR_HAS(e, "rank 1 has group 0 parameter 2: Float [6] where rank 0 has group 0 "
                        "parameter 2: Float [5]");
    EXPECT_ERROR_HAS(e, "same parameters, in the same order");
  }
  EXPECT_ERROR_HAS(errors[1], "seen on rank 1 of 2");

  std::vector<std::string> count_errors(2);
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    std::vector<at::Tensor> params{at::zeros({4}, at::requires_grad())};
    if (pg.rank() == 0) params.push_back(at::zeros({2}, at::requires_grad()));
    count_errors[static_cast<size_t>(pg.rank())] = ddp_test::error_of(
        [&] { ZeroRedundancyOptimizer(params, torch::optim::SGDOptions(0.1), zero_options(pg)); });
  });
  for (const auto& e : count_errors) {
    EXPECT_ERROR_HAS(e, "rank 1 has 1 parameter(s) but rank 0 has 2");
    EXPECT_ERROR_HAS(e, "missing on rank 1 is group 0 parameter 1: Float [2]");
  }
}

TEST(ZeroErrorsTest, NoGroupSaysHowToGetOne) {
  ASSERT_FALSE(ddp::is_initialized());
  const std::string e = ddp_test::error_of([] {
    ZeroRedundancyOptimizer({at::zeros({2}, at::requires_grad())}, torch::optim::AdamOptions(0.1));
  });
  EXPECT_ERROR_HAS(e, "the default group is not initialised");
  EXPECT_ERROR_HAS(e, "ZeroRedundancyOptimizerOptions().process_group(pg)");
}

TEST(ZeroErrorsTest, StateDictBeforeConsolidationAndTorchSave) {
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    ZeroRedundancyOptimizer zero({at::zeros({2}, at::requires_grad())},
                                 torch::optim::AdamOptions(0.1), zero_options(pg));
    EXPECT_ERROR_HAS(ddp_test::error_of([&] { zero.state_dict(); }),
                     "Call consolidate_state_dict(to_rank) on every rank first");
    zero.consolidate_state_dict(1);
    EXPECT_EQ(ddp_test::error_of([&] { zero.state_dict(); }) == "<no exception>", pg.rank() == 1);
    EXPECT_ERROR_HAS(ddp_test::error_of([&] { zero.consolidate_state_dict(2); }),
                     "to_rank must be in 0..1, but got 2");
    torch::serialize::OutputArchive archive;
    EXPECT_ERROR_HAS(ddp_test::error_of([&] { zero.save(archive); }), "Use ddp::save_checkpoint");
  });
}

// A world of one: no collective, the plain optimizer's steps.
TEST(ZeroWorldOneTest, OwnsEverythingAndSendsNothing) {
  run_thread_groups(1, [&](ddp::ProcessGroup& pg) {
    auto model = zero_test::make_wide(1);
    auto zero = zero_test::make_zero("adam", model->parameters(), zero_options(pg));
    for (int owner : zero->owners()) EXPECT_EQ(owner, 0);
    EXPECT_EQ(zero->local_optimizer().param_groups()[0].params().size(),
              model->parameters().size());
  });
}

TEST(ZeroErrorsTest, ParamGroupAddedLaterIsRefused) {
  run_thread_groups(1, [&](ddp::ProcessGroup& pg) {
    ZeroRedundancyOptimizer zero({at::zeros({2}, at::requires_grad())},
                                 torch::optim::SGDOptions(0.1), zero_options(pg));
    zero.add_param_group(torch::optim::OptimizerParamGroup({at::zeros({3}, at::requires_grad())}));
    EXPECT_ERROR_HAS(ddp_test::error_of([&] { zero.step(); }),
                     "built with 1 param group(s) but now has 2: add_param_group after "
                     "construction is not supported");
  });
}

}  // namespace zero_test
