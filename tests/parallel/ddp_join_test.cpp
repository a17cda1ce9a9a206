// Uneven inputs (ddp::join), at 2 and 3 ranks. Rank r has `base + r` batches, so ranks
// run out one after another (with base 0, rank 0 has none at all and shadows from the
// start, through the bucket rebuild). The expectation is single-process maths: at step
// k, the ranks still training (base + r > k) contribute their batch's gradient, the
// sum is divided by the initial world size or by their number, and SGD steps. After
// the scope every rank must hold exactly the same parameters.

#include "parallel/ddp_test_util.h"
#include "support/util.h"

#include <ddp/parallel/comm_hooks.h>
#include <ddp/algorithms/join.h>

#include <torch/nn/modules/linear.h>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace ddp_join_test {

using ddp_test::error_of;
using ddp_test::init_params;
using ddp_test::options_for;
using ddp_test::run_thread_groups;
using ddp_test::TwoHeads;

namespace {

constexpr int64_t kBatch = 3;
constexpr double kLr = 0.1;
constexpr uint64_t kSeed = 7;

at::Tensor batch_x(int rank, int step, int micro = 0) {
  return ddp_test::randn({kBatch, 8}, 1000 + 97 * rank + 13 * step + micro);
}
at::Tensor batch_y(int rank, int step, int micro = 0) {
  return ddp_test::randn({kBatch, 4}, 5000 + 97 * rank + 13 * step + micro);
}

struct Variant {
  int world;
  int base;
  bool divide_by_initial;
  bool even = false;  // every rank has `base` batches
};

void PrintTo(const Variant& v, std::ostream* os) {
  *os << "world " << v.world << ", base " << v.base << ", divide by "
      << (v.divide_by_initial ? "initial" : "active") << (v.even ? ", even" : "");
}

int batches_of(const Variant& v, int rank) { return v.even ? v.base : v.base + rank; }
int batches_of(int rank, int base) { return base + rank; }

/// Which heads TwoHeads uses for rank r's batch k in the unused-parameter test: every
/// combination occurs, and at some steps no rank still training uses head_b.
std::string heads_for(int rank, int step) {
  static const char* kChoice[] = {"a", "ab", "b", "a"};
  return kChoice[(rank + 2 * step) % 4];
}

void sgd_step(torch::nn::Module& m) {
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) {
    if (p.grad().defined()) p.sub_(p.grad() * kLr);
  }
}

void zero_grads(torch::nn::Module& m) {
  for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
}

std::vector<at::Tensor> params_of(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

std::string variant_name(const ::testing::TestParamInfo<Variant>& info) {
  return "world" + std::to_string(info.param.world) + "_base" + std::to_string(info.param.base) +
         (info.param.divide_by_initial ? "_initial" : "_active");
}

/// The single-process expectation. `loss(model, rank, step)` is one rank's loss for its
/// batch at `step` (it may backward micro-batches itself and return an undefined tensor).
template <typename Net>
std::vector<at::Tensor> reference(Net ref, const Variant& v,
                                  const std::function<at::Tensor(Net&, int, int)>& loss) {
  init_params(*ref, kSeed);
  const int steps = batches_of(v, v.world - 1);
  for (int k = 0; k < steps; ++k) {
    zero_grads(*ref);
    int active = 0;
    for (int r = 0; r < v.world; ++r) {
      if (batches_of(v, r) <= k) continue;
      ++active;
      at::Tensor l = loss(ref, r, k);
      if (l.defined()) l.backward();
    }
    const int divisor = v.divide_by_initial ? v.world : active;
    {
      at::NoGradGuard no_grad;
      for (auto& p : ref->parameters()) {
        if (p.grad().defined()) p.grad().div_(divisor);
      }
    }
    sgd_step(*ref);
  }
  return params_of(*ref);
}

/// Runs rank `pg.rank()`'s uneven loop inside dmodel->join and returns its parameters.
template <typename Net>
std::vector<at::Tensor> train_joined(
    ddp::ProcessGroup& pg, Net model, const Variant& v, ddp::DistributedDataParallelOptions options,
    const std::function<at::Tensor(ddp::DistributedDataParallel<Net>&, Net&, int, int)>& loss,
    std::shared_ptr<ddp::CommHook> hook = nullptr, bool enable = true) {
  init_params(*model, kSeed);
  auto dmodel = ddp::DistributedDataParallel<Net>(model, options);
  if (hook) dmodel->register_comm_hook(hook);
  const int rank = pg.rank();
  dmodel->join(
      [&] {
        for (int k = 0; k < batches_of(v, rank); ++k) {
          zero_grads(*model);
          at::Tensor l = loss(dmodel, model, rank, k);
          if (l.defined()) l.backward();
          sgd_step(*model);
        }
      },
      ddp::JoinOptions().divide_by_initial_world_size(v.divide_by_initial).enable(enable));
  return params_of(*model);
}

void expect_same_everywhere(ddp::ProcessGroup& pg, const std::vector<at::Tensor>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    const auto all = pg.all_gather(params[i]);
    for (size_t r = 1; r < all.size(); ++r) {
      EXPECT_TRUE(at::equal(all[r], all[0]))
          << "parameter #" << i << " differs between rank 0 and rank " << r;
    }
  }
}

void expect_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                  double rtol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(ddp_test::rel_error(got[i], want[i]), rtol) << "parameter #" << i;
  }
}

// Rank r's loss on its batch k: single-process (reference) and through DDP.
at::Tensor plain_loss(ddp_test::Mlp& m, int r, int k) {
  return ddp_test::mse(m->forward(batch_x(r, k)), batch_y(r, k));
}
at::Tensor plain_ddp_loss(ddp::DistributedDataParallel<ddp_test::Mlp>& d, ddp_test::Mlp&, int r,
                          int k) {
  return ddp_test::mse(d(batch_x(r, k)), batch_y(r, k));
}

class JoinTest : public ::testing::TestWithParam<Variant> {};

TEST_P(JoinTest, UnevenBatchesMatchSingleProcessAverages) {
  const Variant v = GetParam();
  const auto want = reference<ddp_test::Mlp>(ddp_test::Mlp(), v, plain_loss);
  run_thread_groups(v.world, [&](ddp::ProcessGroup& pg) {
    const auto got =
        train_joined<ddp_test::Mlp>(pg, ddp_test::Mlp(), v, options_for(pg), plain_ddp_loss);
    expect_close(got, want, 1e-5);
    expect_same_everywhere(pg, got);
  });
}

TEST_P(JoinTest, GradientAccumulationUnderNoSync) {
  const Variant v = GetParam();
  const auto want =
      reference<ddp_test::Mlp>(ddp_test::Mlp(), v, [](ddp_test::Mlp& m, int r, int k) {
        ddp_test::mse(m->forward(batch_x(r, k, 0)), batch_y(r, k, 0)).backward();
        return ddp_test::mse(m->forward(batch_x(r, k, 1)), batch_y(r, k, 1));
      });
  run_thread_groups(v.world, [&](ddp::ProcessGroup& pg) {
    const auto got = train_joined<ddp_test::Mlp>(
        pg, ddp_test::Mlp(), v, options_for(pg),
        [](ddp::DistributedDataParallel<ddp_test::Mlp>& d, ddp_test::Mlp&, int r, int k) {
          {
            auto guard = d->no_sync();
            ddp_test::mse(d(batch_x(r, k, 0)), batch_y(r, k, 0)).backward();
          }
          return ddp_test::mse(d(batch_x(r, k, 1)), batch_y(r, k, 1));
        });
    expect_close(got, want, 1e-5);
    expect_same_everywhere(pg, got);
  });
}

TEST_P(JoinTest, UnusedParametersDifferByRankAndStep) {
  const Variant v = GetParam();
  const auto want = reference<TwoHeads>(TwoHeads(), v, [](TwoHeads& m, int r, int k) {
    m->heads = heads_for(r, k);
    return ddp_test::mse(m->forward(batch_x(r, k)), batch_y(r, k));
  });
  run_thread_groups(v.world, [&](ddp::ProcessGroup& pg) {
    const auto got =
        train_joined<TwoHeads>(pg, TwoHeads(), v, options_for(pg).find_unused_parameters(true),
                               [](ddp::DistributedDataParallel<TwoHeads>& d, TwoHeads& m, int r,
                                  int k) {
                                 m->heads = heads_for(r, k);
                                 return ddp_test::mse(d(batch_x(r, k)), batch_y(r, k));
                               });
    expect_close(got, want, 1e-5);
    expect_same_everywhere(pg, got);
  });
}

TEST_P(JoinTest, StaticGraphAndGradientAsBucketView) {
  const Variant v = GetParam();
  const auto want = reference<ddp_test::Mlp>(ddp_test::Mlp(), v, plain_loss);
  run_thread_groups(v.world, [&](ddp::ProcessGroup& pg) {
    const auto got = train_joined<ddp_test::Mlp>(
        pg, ddp_test::Mlp(), v, options_for(pg).static_graph(true).gradient_as_bucket_view(true),
        plain_ddp_loss);
    expect_close(got, want, 1e-5);
    expect_same_everywhere(pg, got);
  });
}

TEST_P(JoinTest, CustomCommHookIsShadowedWithZeros) {
  const Variant v = GetParam();
  // The default hook divides by the world size whatever the option says (as PyTorch's
  // hooks do), so the expectation is the initial-world-size average.
  Variant ref_v = v;
  ref_v.divide_by_initial = true;
  const auto want = reference<ddp_test::Mlp>(ddp_test::Mlp(), ref_v, plain_loss);
  run_thread_groups(v.world, [&](ddp::ProcessGroup& pg) {
    const auto got = train_joined<ddp_test::Mlp>(pg, ddp_test::Mlp(), v, options_for(pg),
                                                 plain_ddp_loss, ddp::comm_hooks::allreduce_hook());
    expect_close(got, want, 1e-5);
    expect_same_everywhere(pg, got);
  });
}

// A buffer that each rank changes differently in forward: before every forward the
// ranks still training take the buffer of the lowest of them (broadcast_buffers), and
// after the scope everyone takes the last joiner's. The value is simulated here.
struct CounterImpl : torch::nn::Module {
  CounterImpl() : fc(register_module("fc", torch::nn::Linear(8, 4))) {
    count = register_buffer("count", at::zeros({1}, at::kDouble));
  }
  at::Tensor forward(const at::Tensor& x) {
    {
      at::NoGradGuard no_grad;
      count.add_(increment);
    }
    return fc(x);
  }
  torch::nn::Linear fc;
  at::Tensor count;
  double increment = 1;
};
TORCH_MODULE(Counter);

TEST_P(JoinTest, BufferBroadcastFollowsTheLowestRankStillTraining) {
  const Variant v = GetParam();
  // Simulation: count[r] per rank, broadcast from the lowest active rank, then += r + 1.
  std::vector<double> count(v.world, 0.0);
  const int steps = batches_of(v.world - 1, v.base);
  for (int k = 0; k < steps; ++k) {
    int src = -1;
    for (int r = 0; r < v.world && src < 0; ++r) {
      if (batches_of(r, v.base) > k) src = r;
    }
    for (int r = 0; r < v.world; ++r) count[r] = count[src];
    for (int r = 0; r < v.world; ++r) {
      if (batches_of(r, v.base) > k) count[r] += r + 1;
    }
  }
  const double want = count[v.world - 1];
  run_thread_groups(v.world, [&](ddp::ProcessGroup& pg) {
    Counter model;
    model->increment = pg.rank() + 1;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    dmodel->join([&] {
      for (int k = 0; k < batches_of(pg.rank(), v.base); ++k) {
        dmodel(batch_x(pg.rank(), k)).sum().backward();
      }
    });
    EXPECT_EQ(model->count.item<double>(), want) << "rank " << pg.rank();
  });
}

// Join on groups made by new_subgroups: two 3-rank jobs at once in 6 ranks, each with
// uneven batches, each equal to its single-process average.
TEST(JoinSubgroupTest, UnevenBatchesOnTwoSubgroupsAtOnce) {
  const Variant v{3, 2, false};
  const auto want = reference<ddp_test::Mlp>(ddp_test::Mlp(), v, plain_loss);
  ddp_test::run_subgroup_copies(v.world, [&](ddp::ProcessGroup& pg) {
    const auto got =
        train_joined<ddp_test::Mlp>(pg, ddp_test::Mlp(), v, options_for(pg), plain_ddp_loss);
    expect_close(got, want, 1e-5);
    expect_same_everywhere(pg, got);
  });
}

INSTANTIATE_TEST_SUITE_P(Uneven, JoinTest,
                         ::testing::Values(Variant{2, 3, true}, Variant{2, 3, false},
                                           Variant{3, 3, true}, Variant{3, 3, false},
                                           Variant{2, 0, true}, Variant{3, 0, false}),
                         variant_name);

// ---- Options and misuse -------------------------------------------------------------

class JoinWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(JoinWorldTest, ThrowOnEarlyTerminationRaisesOnEveryRank) {
  const int world = GetParam();
  run_thread_groups(
      world,
      [&](ddp::ProcessGroup& pg) {
        ddp_test::Mlp model;
        auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
        int steps = 0;
        const std::string error = error_of([&] {
          dmodel->join(
              [&] {
                for (int k = 0; k < batches_of(pg.rank(), 2); ++k) {
                  ddp_test::mse(dmodel(batch_x(pg.rank(), k)), batch_y(pg.rank(), k)).backward();
                  ++steps;
                }
              },
              ddp::JoinOptions().throw_on_early_termination(true));
        });
        EXPECT_ERROR_HAS(error, "rank(s) 0 ran out of inputs");
        EXPECT_ERROR_HAS(error, "throw_on_early_termination");
        // Rank 0 ran its 2 batches; the others raise at their third forward.
        EXPECT_EQ(steps, 2) << "rank " << pg.rank();
      },
      std::chrono::seconds(60));
}

TEST_P(JoinWorldTest, EarlyTerminationIsItsOwnType) {
  const int world = GetParam();
  run_thread_groups(
      world,
      [&](ddp::ProcessGroup& pg) {
        ddp_test::Mlp model;
        auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
        EXPECT_THROW(dmodel->join(
                         [&] {
                           for (int k = 0; k < batches_of(pg.rank(), 1); ++k) {
                             dmodel(batch_x(pg.rank(), k)).sum().backward();
                           }
                         },
                         ddp::JoinOptions().throw_on_early_termination(true)),
                     ddp::EarlyTerminationError);
      },
      std::chrono::seconds(60));
}

TEST_P(JoinWorldTest, DisabledJoinIsPlainDdp) {
  // Every rank has as many batches, which a disabled join needs.
  const Variant v{GetParam(), 3, true, /*even=*/true};
  const auto want = reference<ddp_test::Mlp>(ddp_test::Mlp(), v, plain_loss);
  run_thread_groups(v.world, [&](ddp::ProcessGroup& pg) {
    const auto got = train_joined<ddp_test::Mlp>(pg, ddp_test::Mlp(), v, options_for(pg),
                                                 plain_ddp_loss, nullptr, /*enable=*/false);
    expect_close(got, want, 1e-5);
    expect_same_everywhere(pg, got);
  });
}

TEST_P(JoinWorldTest, RanksDisagreeingAboutNoSyncGetAMismatchError) {
  const int world = GetParam();
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp model;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    const std::string error = error_of([&] {
      dmodel->join([&] {
        if (pg.rank() == 0) {
          auto guard = dmodel->no_sync();
          dmodel(batch_x(0, 0)).sum().backward();
        } else {
          dmodel(batch_x(pg.rank(), 0)).sum().backward();
        }
      });
    });
    EXPECT_ERROR_HAS(error, "under no_sync()");
    EXPECT_ERROR_HAS(error, "rank(s) 0 ran one");
  });
}

TEST_P(JoinWorldTest, ASecondForwardBeforeBackwardIsAnError) {
  const int world = GetParam();
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp model;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    const std::string error = error_of([&] {
      dmodel->join([&] {
        auto first = dmodel(batch_x(pg.rank(), 0));
        auto second = dmodel(batch_x(pg.rank(), 1));
        (first.sum() + second.sum()).backward();
      });
    });
    EXPECT_ERROR_HAS(error, "must be followed by that backward before the next forward");
  });
}

TEST_P(JoinWorldTest, ModelKeepsTrainingAfterTheScope) {
  // A second scope (the next epoch) after ranks shadowed: the buckets were rebuilt on
  // every rank alike, and plain DDP iterations still agree.
  const int world = GetParam();
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp model;
    init_params(*model, kSeed);
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    for (int epoch = 0; epoch < 2; ++epoch) {
      dmodel->join([&] {
        for (int k = 0; k < batches_of(pg.rank(), epoch); ++k) {
          zero_grads(*model);
          ddp_test::mse(dmodel(batch_x(pg.rank(), k)), batch_y(pg.rank(), k)).backward();
          sgd_step(*model);
        }
      });
    }
    zero_grads(*model);
    ddp_test::mse(dmodel(batch_x(pg.rank(), 9)), batch_y(pg.rank(), 9)).backward();
    sgd_step(*model);
    expect_same_everywhere(pg, params_of(*model));
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, JoinWorldTest, ::testing::Values(2, 3));

TEST(JoinWorldOneTest, RunsTheBodyAndMatchesSingleProcess) {
  const Variant v{1, 3, true};
  const auto want = reference<ddp_test::Mlp>(ddp_test::Mlp(), v, plain_loss);
  run_thread_groups(1, [&](ddp::ProcessGroup& pg) {
    const auto got =
        train_joined<ddp_test::Mlp>(pg, ddp_test::Mlp(), v, options_for(pg), plain_ddp_loss);
    expect_close(got, want, 1e-6);
  });
}

}  // namespace

}  // namespace ddp_join_test
