// DistributedDataParallel gradients against single-process references: after one
// backward every rank must hold the gradient of the whole concatenated batch.
//
// Why that is the reference: each rank's loss is the mean over its shard of B rows; DDP
// averages the W shard gradients; with equal shards the mean of shard means is the mean
// over all W*B rows, so the averaged gradient equals the single-process gradient of the
// full batch (up to float summation order).

#include "parallel/ddp_test_util.h"

#include <torch/optim/sgd.h>

#include "distributed/comm.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace ddp_gradients_test {

using ddp_test::borrow;
using ddp_test::options_for;
using ddp_test::rel_error;
using ddp_test::run_thread_groups;

namespace {

constexpr double kRtol = 1e-5;
constexpr int64_t kPerRank = 6;

enum class ModelKind { kMlp, kCnn };

std::string kind_name(ModelKind k) { return k == ModelKind::kMlp ? "mlp" : "cnn"; }

at::Tensor inputs_for(ModelKind kind, int64_t rows) {
  return kind == ModelKind::kMlp ? ddp_test::randn({rows, 8}, 11)
                                 : ddp_test::randn({rows, 1, 8, 8}, 11);
}

// One DDP step on every rank of `world`, compared with the full-batch gradient: twice,
// with PyTorch's initial single bucket and then with the buckets rebuilt after it.
template <typename Net>
void check_one_step(int world, const ddp::DistributedDataParallelOptions& base, at::Tensor x,
                    at::Tensor y) {
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    // Reference: the same initial weights, single process, whole batch.
    auto want = ddp_test::full_batch_grads(Net(), 42, x, y);

    Net model;
    ddp_test::init_params(*model, 42);
    auto options = base;
    auto dmodel = ddp::DistributedDataParallel(model, options.process_group(borrow(pg)));
    for (const char* pass : {"initial buckets", "rebuilt buckets"}) {
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      auto loss =
          ddp_test::mse(dmodel(ddp_test::shard(x, r, kPerRank)), ddp_test::shard(y, r, kPerRank));
      loss.backward();
      ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, kRtol,
                                   "rank " + std::to_string(r) + ", " + pass);
    }
  });
}

}  // namespace

// ---- Models x world sizes --------------------------------------------------------------

class GradientEquivalenceTest : public ::testing::TestWithParam<std::tuple<int, ModelKind>> {};

TEST_P(GradientEquivalenceTest, MatchesFullBatchGradient) {
  const int world = std::get<0>(GetParam());
  const ModelKind kind = std::get<1>(GetParam());
  auto x = inputs_for(kind, world * kPerRank);
  auto y = ddp_test::randn({world * kPerRank, 4}, 12);
  if (kind == ModelKind::kMlp) {
    check_one_step<ddp_test::Mlp>(world, ddp::DistributedDataParallelOptions(), x, y);
  } else {
    check_one_step<ddp_test::Cnn>(world, ddp::DistributedDataParallelOptions(), x, y);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndModels, GradientEquivalenceTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(ModelKind::kMlp, ModelKind::kCnn)),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_" +
                                  kind_name(std::get<1>(info.param));
                         });

// ---- Bucket sizes ----------------------------------------------------------------------

class BucketSizeTest : public ::testing::TestWithParam<double> {};

TEST_P(BucketSizeTest, MatchesFullBatchGradient) {
  const int world = 3;
  auto x = inputs_for(ModelKind::kMlp, world * kPerRank);
  auto y = ddp_test::randn({world * kPerRank, 4}, 12);
  auto options = ddp::DistributedDataParallelOptions().bucket_cap_mb(GetParam());
  check_one_step<ddp_test::Mlp>(world, options, x, y);
}

TEST_P(BucketSizeTest, AssignmentHasTheExpectedShape) {
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp model;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg).bucket_cap_mb(GetParam()));
    const size_t n = dmodel->reduced_parameter_names().size();
    // Before the first backward, whatever the cap: PyTorch's single bucket, in parameter
    // order.
    std::vector<size_t> all(n);
    for (size_t i = 0; i < n; ++i) all[i] = i;
    EXPECT_EQ(dmodel->bucket_indices(), std::vector<std::vector<size_t>>{all});
    dmodel(ddp_test::randn({kPerRank, 8}, 5)).sum().backward();
    dmodel(ddp_test::randn({kPerRank, 8}, 6));  // rebuilt here
    const auto buckets = dmodel->bucket_indices();
    if (GetParam() < 1e-5) {
      // Below the smallest parameter: one parameter per bucket. The MLP's gradients
      // arrive last layer first.
      ASSERT_EQ(buckets.size(), n);
      EXPECT_EQ(buckets.front().size(), 1u);
      EXPECT_GE(buckets.front()[0], n - 2);  // fc3's weight or bias
      EXPECT_LE(buckets.back()[0], 1u);      // fc1's
    } else {
      ASSERT_EQ(buckets.size(), 1u);
      EXPECT_EQ(buckets[0].size(), n);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(TinyAndHuge, BucketSizeTest, ::testing::Values(1e-6, 1000.0),
                         [](const auto& info) {
                           return info.param < 1 ? std::string("tiny") : std::string("huge");
                         });

// ---- Unused parameters -------------------------------------------------------------------

TEST(UnusedParametersTest, UnusedBranchEverywhereKeepsItsGradUndefined) {
  const int world = 2;
  auto x = ddp_test::randn({world * kPerRank, 8}, 21);
  auto y = ddp_test::randn({world * kPerRank, 4}, 22);
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    auto want = ddp_test::full_batch_grads(ddp_test::BranchNet(), 5, x, y);
    // head_b (parameters 4 and 5): the reference agrees that it is unused.
    ASSERT_FALSE(want[4].defined() || want[5].defined());

    ddp_test::BranchNet model;
    ddp_test::init_params(*model, 5);
    auto dmodel = ddp::DistributedDataParallel(
        model, options_for(pg).find_unused_parameters(true).bucket_cap_mb(1e-6));
    for (int iter = 0; iter < 3; ++iter) {  // also: later iterations do not complain
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      ddp_test::mse(dmodel(ddp_test::shard(x, r, kPerRank)), ddp_test::shard(y, r, kPerRank))
          .backward();
      ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, kRtol,
                                   "iteration " + std::to_string(iter));
    }
  });
}

TEST(UnusedParametersTest, BranchUsedOnOneRankIsAveragedWithZeros) {
  // Rank 1 uses head_b, rank 0 does not. The right average is the mean over ranks of
  // each rank's own gradient, rank 0 contributing zero for head_b; computed per shard.
  const int world = 2;
  auto x = ddp_test::randn({world * kPerRank, 8}, 23);
  auto y = ddp_test::randn({world * kPerRank, 4}, 24);
  std::vector<std::vector<at::Tensor>> per_rank;
  for (int q = 0; q < world; ++q) {
    ddp_test::BranchNet ref;
    ddp_test::init_params(*ref, 6);
    ref->use_b = q == 1;
    per_rank.push_back(ddp_test::grads_after(*ref, [&] {
      return ddp_test::mse(ref(ddp_test::shard(x, q, kPerRank)), ddp_test::shard(y, q, kPerRank));
    }));
  }
  std::vector<at::Tensor> want;
  for (size_t i = 0; i < per_rank[0].size(); ++i) {
    at::Tensor sum = at::zeros_like(per_rank[1][i]);
    for (int q = 0; q < world; ++q) {
      if (per_rank[q][i].defined()) sum += per_rank[q][i];
    }
    want.push_back(sum / world);
  }
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    ddp_test::BranchNet model;
    ddp_test::init_params(*model, 6);
    model->use_b = r == 1;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg).find_unused_parameters(true));
    ddp_test::mse(dmodel(ddp_test::shard(x, r, kPerRank)), ddp_test::shard(y, r, kPerRank))
        .backward();
    ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, kRtol,
                                 "rank " + std::to_string(r));
  });
}

TEST(UnusedParametersTest, StaticGraphHandlesAFixedUnusedBranch) {
  // static_graph needs no find_unused_parameters for a branch unused in every iteration.
  const int world = 2;
  auto x = ddp_test::randn({world * kPerRank, 8}, 25);
  auto y = ddp_test::randn({world * kPerRank, 4}, 26);
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    auto want = ddp_test::full_batch_grads(ddp_test::BranchNet(), 7, x, y);
    ddp_test::BranchNet model;
    ddp_test::init_params(*model, 7);
    auto dmodel =
        ddp::DistributedDataParallel(model, options_for(pg).static_graph(true).bucket_cap_mb(1e-6));
    for (int iter = 0; iter < 3; ++iter) {
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      ddp_test::mse(dmodel(ddp_test::shard(x, r, kPerRank)), ddp_test::shard(y, r, kPerRank))
          .backward();
      ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, kRtol,
                                   "iteration " + std::to_string(iter));
      const auto stats = dmodel->last_iteration_stats();
      // The first iteration reduces everything at the end; later ones overlap.
      if (iter == 0) {
        EXPECT_EQ(stats.buckets_launched_before_end, 0u);
      } else {
        EXPECT_EQ(stats.buckets_launched_before_end, stats.num_buckets);
      }
    }
  });
}

// ---- BatchNorm -------------------------------------------------------------------------

TEST(BatchNormTest, TrainModeMatchesPerShardReference) {
  // In train mode BatchNorm normalises with each rank's own batch statistics, so the
  // loss is not the full-batch loss and the full-batch gradient is the wrong reference.
  // What DDP must produce is the mean over ranks of each rank's gradient on its shard
  // (statistics of that shard): computed here one shard at a time, single process.
  const int world = 3;
  auto x = ddp_test::randn({world * kPerRank, 8}, 31);
  auto y = ddp_test::randn({world * kPerRank, 4}, 32);
  std::vector<at::Tensor> want;
  for (int q = 0; q < world; ++q) {
    ddp_test::BnNet ref;
    ddp_test::init_params(*ref, 8);
    auto g = ddp_test::grads_after(*ref, [&] {
      return ddp_test::mse(ref(ddp_test::shard(x, q, kPerRank)), ddp_test::shard(y, q, kPerRank));
    });
    for (size_t i = 0; i < g.size(); ++i) {
      if (q == 0)
        want.push_back(g[i] / world);
      else
        want[i] += g[i] / world;
    }
  }
  // Sanity: this differs from the full-batch gradient, so the test can tell them apart.
  {
    ddp_test::BnNet full;
    ddp_test::init_params(*full, 8);
    auto g = ddp_test::grads_after(*full, [&] { return ddp_test::mse(full(x), y); });
    EXPECT_GT(rel_error(g[0], want[0]), 1e-3);
  }
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    ddp_test::BnNet model;
    ddp_test::init_params(*model, 8);
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    ddp_test::mse(dmodel(ddp_test::shard(x, r, kPerRank)), ddp_test::shard(y, r, kPerRank))
        .backward();
    ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, kRtol,
                                 "rank " + std::to_string(r));
  });
}

TEST(BatchNormTest, EvalModeMatchesFullBatchGradient) {
  // In eval mode BatchNorm uses the running statistics, the same on every rank (rank 0's,
  // broadcast), so the full-batch gradient is again the reference.
  const int world = 2;
  auto x = ddp_test::randn({world * kPerRank, 8}, 33);
  auto y = ddp_test::randn({world * kPerRank, 4}, 34);
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    ddp_test::BnNet ref;
    ddp_test::init_params(*ref, 9);
    ref->eval();
    auto want = ddp_test::grads_after(*ref, [&] { return ddp_test::mse(ref(x), y); });
    ddp_test::BnNet model;
    ddp_test::init_params(*model, 9);
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    dmodel->eval();
    ddp_test::mse(dmodel(ddp_test::shard(x, r, kPerRank)), ddp_test::shard(y, r, kPerRank))
        .backward();
    ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, kRtol,
                                 "rank " + std::to_string(r));
  });
}

// ---- Several steps -----------------------------------------------------------------------

TEST(TrainingTest, ParametersStayBitIdenticalAcrossRanks) {
  const int world = 3;
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    ddp_test::Mlp model;
    ddp_test::init_params(*model, 13);
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg).bucket_cap_mb(0.001));
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < 6; ++step) {
      opt.zero_grad();
      auto x = ddp_test::randn({kPerRank, 8}, 1000 + step * 10 + r);  // different per rank
      auto y = ddp_test::randn({kPerRank, 4}, 2000 + step * 10 + r);
      ddp_test::mse(dmodel(x), y).backward();
      opt.step();
    }
    for (auto& p : model->parameters()) {
      auto all = pg.all_gather(p.detach());
      for (int q = 1; q < world; ++q) {
        EXPECT_TRUE(at::equal(all[q], all[0])) << "rank " << q << " differs from rank 0";
      }
    }
  });
}

TEST(TrainingTest, ConstructionGivesEveryRankRank0sWeightsAndBuffers) {
  const int world = 3;
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    ddp_test::BnNet model;
    ddp_test::init_params(*model, 100 + r);  // different weights on every rank
    {
      at::NoGradGuard no_grad;
      model->bn->running_mean.fill_(static_cast<float>(r + 1));
    }
    ddp_test::BnNet rank0;  // what rank 0 started from, built independently
    ddp_test::init_params(*rank0, 100);
    if (r != 0) {
      EXPECT_FALSE(at::equal(model->fc1->weight, rank0->fc1->weight));
    }
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    auto got = model->parameters();
    auto want = rank0->parameters();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << i;
    EXPECT_TRUE(at::equal(model->bn->running_mean, at::ones({16})));
  });
}

TEST(NoSyncTest, AccumulatedMicroBatchesEqualOneBigBatch) {
  // k micro-batches, the first k-1 under no_sync. Each rank accumulates the sum of its
  // k shard-mean gradients; the synced backward averages that sum. Reference: the sum
  // over micro-batches of the full (all ranks) micro-batch mean gradient.
  const int world = 2, k = 3;
  auto x = ddp_test::randn({k, world * kPerRank, 8}, 41);
  auto y = ddp_test::randn({k, world * kPerRank, 4}, 42);
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    ddp_test::Mlp ref;
    ddp_test::init_params(*ref, 14);
    for (int m = 0; m < k; ++m) ddp_test::mse(ref(x[m]), y[m]).backward();
    auto want = ddp_test::current_grads(*ref);

    ddp_test::Mlp model;
    ddp_test::init_params(*model, 14);
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg).bucket_cap_mb(0.001));
    {
      auto guard = dmodel->no_sync();
      for (int m = 0; m < k - 1; ++m) {
        ddp_test::mse(dmodel(ddp_test::shard(x[m], r, kPerRank)),
                      ddp_test::shard(y[m], r, kPerRank))
            .backward();
      }
      EXPECT_EQ(dmodel->last_iteration_stats().iteration, 0);  // nothing reduced yet
    }
    ddp_test::mse(dmodel(ddp_test::shard(x[k - 1], r, kPerRank)),
                  ddp_test::shard(y[k - 1], r, kPerRank))
        .backward();
    EXPECT_EQ(dmodel->last_iteration_stats().iteration, 1);
    ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, kRtol,
                                 "rank " + std::to_string(r));
  });
}

TEST(GradientAsBucketViewTest, MatchesReferenceAndAliasesBuckets) {
  const int world = 2;
  auto x = ddp_test::randn({3, world * kPerRank, 8}, 51);
  auto y = ddp_test::randn({3, world * kPerRank, 4}, 52);
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    ddp_test::Mlp ref;
    ddp_test::init_params(*ref, 15);
    torch::optim::SGD ref_opt(ref->parameters(), 0.1);
    ddp_test::Mlp model;
    ddp_test::init_params(*model, 15);
    auto dmodel = ddp::DistributedDataParallel(
        model, options_for(pg).gradient_as_bucket_view(true).bucket_cap_mb(0.001));
    torch::optim::SGD opt(model->parameters(), 0.1);
    for (int it = 0; it < 3; ++it) {  // first arrival, steady state, after the rebuild
      ref_opt.zero_grad();
      ddp_test::mse(ref(x[it]), y[it]).backward();
      opt.zero_grad();  // works on bucket views (they are not autograd views)
      ddp_test::mse(dmodel(ddp_test::shard(x[it], r, kPerRank)),
                    ddp_test::shard(y[it], r, kPerRank))
          .backward();
      ddp_test::expect_grads_close(ddp_test::current_grads(*model), ddp_test::current_grads(*ref),
                                   kRtol, "iteration " + std::to_string(it));
      ref_opt.step();
      opt.step();
    }
    // Gradients of one bucket lie back to back in its buffer.
    const auto params = model->parameters();
    for (const auto& bucket : dmodel->bucket_indices()) {
      for (size_t k = 1; k < bucket.size(); ++k) {
        const auto& prev = params[bucket[k - 1]].grad();
        const auto& cur = params[bucket[k]].grad();
        EXPECT_TRUE(cur.is_alias_of(prev));
        EXPECT_EQ(static_cast<const char*>(cur.data_ptr()),
                  static_cast<const char*>(prev.data_ptr()) + prev.nbytes());
      }
    }
  });
}

// A hidden layer of 1100 x 1100 floats (4.8 MB) is above the size from which the reducer
// copies gradients into their buckets, and back, with non-temporal stores (Note
// [Streaming bucket copies]): at 3 ranks (1/3 is not exact in binary), with and without
// gradient_as_bucket_view, across a bucket rebuild, every rank holds the full-batch
// gradient and the same bits as every other rank.
TEST(GradientEquivalenceTest, LargeGradientsTakeTheStreamingCopy) {
  const int world = 3;
  const int64_t hidden = 1100;
  auto x = ddp_test::randn({2, world * kPerRank, 8}, 61);
  auto y = ddp_test::randn({2, world * kPerRank, 4}, 62);
  for (const bool as_view : {false, true}) {
    SCOPED_TRACE(as_view ? "gradient_as_bucket_view" : "copied back");
    std::vector<std::vector<at::Tensor>> got(world);
    run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
      const int r = pg.rank();
      ddp_test::Mlp model(8, hidden, 4);
      ddp_test::init_params(*model, 21);
      auto dmodel =
          ddp::DistributedDataParallel(model, options_for(pg).gradient_as_bucket_view(as_view));
      for (int it = 0; it < 2; ++it) {  // the initial bucket, then the rebuilt ones
        model->zero_grad();
        ddp_test::mse(dmodel(ddp_test::shard(x[it], r, kPerRank)),
                      ddp_test::shard(y[it], r, kPerRank))
            .backward();
        auto want = ddp_test::full_batch_grads(ddp_test::Mlp(8, hidden, 4), 21, x[it], y[it]);
        ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, kRtol,
                                     "rank " + std::to_string(r) + ", iteration " +
                                         std::to_string(it));
      }
      for (const auto& g : ddp_test::current_grads(*model)) got[r].push_back(g.clone());
    });
    for (int r = 1; r < world; ++r) {
      for (size_t i = 0; i < got[0].size(); ++i) {
        EXPECT_TRUE(at::equal(got[r][i], got[0][i])) << "rank " << r << ", gradient #" << i;
      }
    }
  }
}

namespace {

// Whether DDP's gradients should be reduced in place on shm here: the kernel lets root
// read its peers' memory, unless DDP_SHM_CMA=0 turns it off.
bool in_place_expected() {
  const char* cma = std::getenv("DDP_SHM_CMA");
  return ::geteuid() == 0 && !(cma != nullptr && std::string(cma) == "0");
}

// Runs fn(pg) on `world` threads, each with its own "shm" group, whatever
// DDP_TEST_BACKEND says.
void run_shm_groups(int world, const std::function<void(ddp::ProcessGroup& pg)>& fn) {
  ddp_test::TempDir dir;
  ddp_test::run_threads(world, [&](int rank) {
    auto pg = ddp::ProcessGroup::create(ddp_test::file_init(dir, rank, world).backend("shm"));
    fn(*pg);
    pg->barrier();
  });
}

}  // namespace

// Note [Gradients reduced in place]: on shm, with the default hook, every bucket's
// gradients are all-reduced where they are, and end with the bits that the bucket
// buffers give (gradient_as_bucket_view keeps the buckets, as a comm hook does). The
// gradients are set to none between iterations, so that gradient_as_bucket_view copies
// each one into its bucket scaled by 1/n, as the other paths scale it; a gradient that
// already lives in its bucket is divided by n instead, as in PyTorch, which can round
// differently.
TEST(GradientEquivalenceTest, OnSharedMemoryGradientsAreReducedWhereTheyAre) {
  const int world = 3;
  auto x = ddp_test::randn({3, world * kPerRank, 8}, 71);
  auto y = ddp_test::randn({3, world * kPerRank, 4}, 72);
  enum Mode { kDefault, kAsView, kHook };
  std::vector<std::vector<std::vector<at::Tensor>>> got(3, std::vector<std::vector<at::Tensor>>(
                                                               world));
  for (const Mode mode : {kDefault, kAsView, kHook}) {
    SCOPED_TRACE(mode == kDefault  ? "default"
                 : mode == kAsView ? "gradient_as_bucket_view"
                                   : "hook");
    run_shm_groups(world, [&](ddp::ProcessGroup& pg) {
      const int r = pg.rank();
      const bool can = ddp::detail::comm_of(pg).reduces_in_place(at::kFloat, 1);
      if (in_place_expected()) ASSERT_TRUE(can) << "the kernel lets root read its peers' memory";
      ddp_test::Mlp model(8, 300, 4);
      ddp_test::init_params(*model, 31);
      auto dmodel =
          ddp::DistributedDataParallel(model, options_for(pg)
                                                  .gradient_as_bucket_view(mode == kAsView)
                                                  .bucket_cap_mb(0.1));  // several buckets
      if (mode == kHook) dmodel->register_comm_hook(ddp::comm_hooks::allreduce_hook());
      for (int it = 0; it < 3; ++it) {           // the initial bucket, then the rebuilt ones
        model->zero_grad(/*set_to_none=*/true);  // fresh gradients, as LibTorch 2.x's default
        ddp_test::mse(dmodel(ddp_test::shard(x[it], r, kPerRank)),
                      ddp_test::shard(y[it], r, kPerRank))
            .backward();
        const ddp::IterationStats stats = dmodel->last_iteration_stats();
        EXPECT_EQ(stats.buckets_reduced_in_place, mode == kDefault && can ? stats.num_buckets : 0u)
            << "iteration " << it << " of " << stats.num_buckets << " buckets";
        auto want = ddp_test::full_batch_grads(ddp_test::Mlp(8, 300, 4), 31, x[it], y[it]);
        ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, kRtol,
                                     "rank " + std::to_string(r) + ", iteration " +
                                         std::to_string(it));
      }
      EXPECT_GT(dmodel->last_iteration_stats().num_buckets, 1u);
      for (const auto& g : ddp_test::current_grads(*model)) got[mode][r].push_back(g.clone());
    });
  }
  // The same bits on every rank; and the bucket path's bits when the gradients were
  // reduced in place (a hook sums first and divides after, which rounds differently).
  for (const Mode mode : {kDefault, kAsView, kHook}) {
    const Mode like = mode == kHook ? kHook : kDefault;
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < got[0][0].size(); ++i) {
        EXPECT_TRUE(at::equal(got[mode][r][i], got[like][0][i]))
            << "mode " << mode << ", rank " << r << ", gradient #" << i;
      }
    }
  }
}

// Two parameters whose .grad() is one tensor (which a user may set up): the reduction in
// place must not reduce that memory twice. Each parameter's gradient is the average, as
// with bucket buffers.
TEST(GradientEquivalenceTest, GradientsThatShareMemoryAreReducedOnce) {
  const int world = 2;
  std::vector<at::Tensor> got(world);
  bool in_place = true;
  run_shm_groups(world, [&](ddp::ProcessGroup& pg) {
    if (!ddp::detail::comm_of(pg).reduces_in_place(at::kFloat, 1)) in_place = false;
    auto a = torch::nn::Linear(torch::nn::LinearOptions(64, 64).bias(false));
    auto b = torch::nn::Linear(torch::nn::LinearOptions(64, 64).bias(false));
    auto model = torch::nn::Sequential(a, b);
    ddp_test::init_params(*model, 5);
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    const at::Tensor shared = at::zeros({64, 64});
    a->weight.mutable_grad() = shared;
    b->weight.mutable_grad() = shared;
    const at::Tensor x = at::full({2, 64}, 0.01 * (pg.rank() + 1));
    dmodel(x).sum().backward();
    got[pg.rank()] = shared.clone();
    EXPECT_TRUE(a->weight.grad().is_same(shared));
  });
  EXPECT_TRUE(at::equal(got[0], got[1]));
  if (in_place_expected()) ASSERT_TRUE(in_place) << "the kernel lets root read its peers' memory";
  if (!in_place) return;  // bucket buffers: each gradient is copied when it arrives
  // Each rank accumulated both layers' gradients into the one tensor; every rank ends
  // with the average of those sums.
  std::vector<at::Tensor> local(world);
  for (int r = 0; r < world; ++r) {
    auto a = torch::nn::Linear(torch::nn::LinearOptions(64, 64).bias(false));
    auto b = torch::nn::Linear(torch::nn::LinearOptions(64, 64).bias(false));
    auto model = torch::nn::Sequential(a, b);
    ddp_test::init_params(*model, 5);
    model->forward(at::full({2, 64}, 0.01 * (r + 1))).sum().backward();
    local[r] = a->weight.grad() + b->weight.grad();
  }
  const at::Tensor want = (local[0] + local[1]) / 2;
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(at::allclose(got[r], want, 1e-5, 1e-7)) << "rank " << r;
  }
}

}  // namespace ddp_gradients_test
