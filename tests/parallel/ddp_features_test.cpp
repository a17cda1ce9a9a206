// Comm hooks, bucket rebuild, buffers, the wrapper's interface, world size 1, stats.

#include "parallel/ddp_test_util.h"

#include "parallel/bucket_assignment.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace ddp_features_test {

using ddp_test::borrow;
using ddp_test::options_for;
using ddp_test::rel_error;
using ddp_test::run_thread_groups;

namespace {

constexpr int64_t kPerRank = 6;

// Exact average over ranks of the local gradients, computed without DDP: each rank's
// gradient is all-gathered and averaged in float64.
std::vector<at::Tensor> exact_average(ddp::ProcessGroup& pg, torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (auto& p : m.parameters()) {
    auto all = pg.all_gather(p.grad().to(at::kDouble));
    at::Tensor sum = at::zeros_like(all[0]);
    for (auto& t : all) sum += t;
    out.push_back(sum / pg.size());
  }
  return out;
}

// Local (unreduced) gradients of the shard, and the same model under DDP with `hook`.
void check_hook(const std::shared_ptr<ddp::CommHook>& hook, double rtol, int world) {
  auto x = ddp_test::randn({world * kPerRank, 8}, 61);
  auto y = ddp_test::randn({world * kPerRank, 4}, 62);
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    ddp_test::Mlp local;
    ddp_test::init_params(*local, 16);
    ddp_test::mse(local(ddp_test::shard(x, r, kPerRank)), ddp_test::shard(y, r, kPerRank))
        .backward();
    const auto want = exact_average(pg, *local);

    ddp_test::Mlp model;
    ddp_test::init_params(*model, 16);
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg).bucket_cap_mb(0.001));
    dmodel->register_comm_hook(hook);
    ddp_test::mse(dmodel(ddp_test::shard(x, r, kPerRank)), ddp_test::shard(y, r, kPerRank))
        .backward();
    double worst = 0, total_err = 0;
    const auto got = ddp_test::current_grads(*model);
    for (size_t i = 0; i < got.size(); ++i) {
      const double e = rel_error(got[i].to(at::kDouble), want[i]);
      worst = std::max(worst, e);
      total_err += (got[i].to(at::kDouble) - want[i]).abs().sum().item<double>();
      // Element-wise too: each value within the format's rounding of the largest one.
      const double scale = want[i].abs().max().item<double>();
      EXPECT_LE((got[i].to(at::kDouble) - want[i]).abs().max().item<double>(), rtol * scale)
          << "gradient #" << i << " on rank " << r;
    }
    EXPECT_LE(worst, rtol) << "rank " << r;
    EXPECT_GT(total_err, 0.0) << "no rounding at all: was the compression applied?";
  });
}

}  // namespace

// ---- Comm hooks ----------------------------------------------------------------------

TEST(CommHookTest, Fp16WithinHalfPrecisionOfExactAverage) {
  // fp16: 11-bit significand, unit roundoff 2^-11 ~ 4.9e-4; rounding of the inputs and
  // of the sum (and the division by world) stays within a few units.
  check_hook(ddp::comm_hooks::fp16_compress_hook(), 4 * std::ldexp(1.0, -11), 3);
}

TEST(CommHookTest, Bf16WithinBfloat16PrecisionOfExactAverage) {
  // bf16: 8-bit significand, unit roundoff 2^-8 ~ 3.9e-3.
  check_hook(ddp::comm_hooks::bf16_compress_hook(), 4 * std::ldexp(1.0, -8), 3);
}

TEST(CommHookTest, ExplicitDefaultHookIsExact) {
  const int world = 2;
  auto x = ddp_test::randn({world * kPerRank, 8}, 63);
  auto y = ddp_test::randn({world * kPerRank, 4}, 64);
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    auto want = ddp_test::full_batch_grads(ddp_test::Mlp(), 17, x, y);
    ddp_test::Mlp model;
    ddp_test::init_params(*model, 17);
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    dmodel->register_comm_hook(ddp::comm_hooks::allreduce_hook());
    ddp_test::mse(dmodel(ddp_test::shard(x, r, kPerRank)), ddp_test::shard(y, r, kPerRank))
        .backward();
    ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, 1e-5, "allreduce");
  });
}

TEST(CommHookTest, UserHookSeesBucketsInOrderAndItsResultIsUsed) {
  // A user hook that sums without dividing: gradients must come out world times the
  // average, and the hook must see every bucket once, in launch order.
  const int world = 3;
  auto x = ddp_test::randn({world * kPerRank, 8}, 65);
  auto y = ddp_test::randn({world * kPerRank, 4}, 66);
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    auto want = ddp_test::full_batch_grads(ddp_test::Mlp(), 18, x, y);
    ddp_test::Mlp model;
    ddp_test::init_params(*model, 18);
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg).bucket_cap_mb(0.001));
    std::vector<size_t> seen;
    size_t params_seen = 0;
    bool last_flag_ok = true;
    const size_t num_buckets = dmodel->bucket_indices().size();
    dmodel->register_comm_hook([&](ddp::GradBucket& bucket) {
      seen.push_back(bucket.index());
      params_seen += bucket.parameters().size();
      last_flag_ok &= bucket.is_last() == (bucket.index() + 1 == num_buckets);
      // On shm the buckets live in the group's shared memory (Note [Zero-copy buffers]).
      EXPECT_EQ(ddp_test::in_shared_segment(bucket.buffer().data_ptr()), pg.backend() == "shm")
          << "bucket " << bucket.index() << " on " << pg.backend();
      // gradients() are views of buffer() shaped like the parameters.
      auto grads = bucket.gradients();
      for (size_t k = 0; k < grads.size(); ++k) {
        EXPECT_EQ(grads[k].sizes(), bucket.parameters()[k].sizes());
        EXPECT_TRUE(grads[k].is_alias_of(bucket.buffer()));
      }
      at::Tensor summed = bucket.buffer().clone();
      std::vector<at::Tensor> tensors{summed};
      auto fut = bucket.process_group().all_reduce_async(tensors, ddp::ReduceOp::SUM).future();
      // Return a plain Tensor (not a list), which must also be accepted.
      return fut->then([summed](c10::ivalue::Future&) -> c10::IValue { return summed; },
                       c10::TensorType::get());
    });
    ddp_test::mse(dmodel(ddp_test::shard(x, r, kPerRank)), ddp_test::shard(y, r, kPerRank))
        .backward();
    std::vector<size_t> expected(num_buckets);
    for (size_t b = 0; b < num_buckets; ++b) expected[b] = b;
    EXPECT_EQ(seen, expected);
    EXPECT_EQ(params_seen, model->parameters().size());
    EXPECT_TRUE(last_flag_ok);
    const auto got = ddp_test::current_grads(*model);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LE(rel_error(got[i], want[i] * world), 1e-5) << i;
    }
  });
}

// ---- Bucket rebuild ----------------------------------------------------------------------

namespace {

// Two square layers whose order in forward is chosen per rank. Gradients arrive for
// the layer run last first. Registration order is a, b, so the initial (reverse) order
// is b.bias, b.weight, a.bias, a.weight.
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl()
      : a(register_module("a", torch::nn::Linear(8, 8))),
        b(register_module("b", torch::nn::Linear(8, 8))) {}
  at::Tensor forward(const at::Tensor& x) {
    return a_first ? b(at::relu(a(x))) : a(at::relu(b(x)));
  }
  torch::nn::Linear a, b;
  bool a_first = true;
};
TORCH_MODULE(TwoLayer);

}  // namespace

TEST(BucketRebuildTest, FollowsRank0ReadyOrderOnEveryRank) {
  const int world = 2;
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    TwoLayer model;
    model->a_first = r != 0;  // rank 0 runs b then a: its gradients come for a first
    // Independent record of the order in which gradients arrive: tensor hooks on the
    // parameters run right before their accumulators.
    std::vector<size_t> arrival;
    std::mutex mu;
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].register_hook([&, i](const at::Tensor& g) {
        std::lock_guard<std::mutex> lock(mu);
        arrival.push_back(i);
        return g;
      });
    }
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg).bucket_cap_mb(1e-6));
    // PyTorch's initial layout: one bucket, parameter order (Note [Bucket order]).
    const std::vector<std::vector<size_t>> initial = {{0, 1, 2, 3}};
    EXPECT_EQ(dmodel->bucket_indices(), initial);

    dmodel(ddp_test::randn({4, 8}, 70 + r)).sum().backward();
    ASSERT_EQ(arrival.size(), 4u);
    // Rank 0's arrival order, as every rank must adopt it.
    std::vector<int64_t> mine(arrival.begin(), arrival.end());
    auto rank0 = pg.all_gather(at::tensor(mine, at::kLong))[0];
    EXPECT_EQ(dmodel->bucket_indices(), initial);  // not rebuilt before the next forward

    dmodel(ddp_test::randn({4, 8}, 80 + r)).sum().backward();
    std::vector<std::vector<size_t>> expected;
    for (int64_t k = 0; k < rank0.numel(); ++k) {
      expected.push_back({static_cast<size_t>(rank0[k].item<int64_t>())});
    }
    EXPECT_EQ(dmodel->bucket_indices(), expected) << "rank " << r;
    EXPECT_NE(expected, initial);  // the test would not notice a missing rebuild otherwise
    // And every rank agrees.
    std::vector<int64_t> flat;
    for (const auto& b : dmodel->bucket_indices()) flat.push_back(static_cast<int64_t>(b[0]));
    auto all = pg.all_gather(at::tensor(flat, at::kLong));
    EXPECT_TRUE(at::equal(all[0], all[1]));
  });
}

TEST(BucketAssignmentTest, FirstBucketCappedThenCap) {
  using ddp::detail::ParamSpec;
  // Five float tensors of 100 elements (400 bytes) each.
  std::vector<ParamSpec> p(5, ParamSpec{100, c10::ScalarType::Float, c10::Device("cpu")});
  auto order = ddp::detail::reverse_order(5);
  // First cap 400 bytes closes after one tensor; then 1000 bytes closes after three.
  auto b = ddp::detail::assign_buckets(p, order, 400, 1000);
  std::vector<std::vector<size_t>> want = {{4}, {3, 2, 1}, {0}};
  EXPECT_EQ(b, want);
  // Huge caps: one bucket, in visiting order.
  b = ddp::detail::assign_buckets(p, {2, 0, 4, 1, 3}, 1 << 30, 1 << 30);
  want = {{2, 0, 4, 1, 3}};
  EXPECT_EQ(b, want);
}

TEST(BucketAssignmentTest, DtypesGetSeparateBucketsOrderedByCompletion) {
  using ddp::detail::ParamSpec;
  const c10::Device cpu("cpu");
  std::vector<ParamSpec> p = {{10, c10::ScalarType::Float, cpu},
                              {10, c10::ScalarType::Double, cpu},
                              {10, c10::ScalarType::Float, cpu},
                              {10, c10::ScalarType::Double, cpu}};
  // Caps large: two open buckets, closed at the end; the double one completes at
  // position 1 (param 1 visited last of them? order 3,2,1,0: doubles at 0 and 2).
  auto b = ddp::detail::assign_buckets(p, {3, 2, 1, 0}, 1 << 20, 1 << 20);
  std::vector<std::vector<size_t>> want = {{3, 1}, {2, 0}};
  EXPECT_EQ(b, want);
  // Empty model.
  EXPECT_TRUE(ddp::detail::assign_buckets({}, {}, 1, 1).empty());
}

TEST(BucketAssignmentTest, InitialBucketsFollowPyTorch) {
  using ddp::detail::ParamSpec;
  const c10::Device cpu("cpu");
  std::vector<ParamSpec> p(5, ParamSpec{100, c10::ScalarType::Float, cpu});  // 400 B each
  // Default (no find_unused_parameters): one bucket in parameter order.
  std::vector<std::vector<size_t>> want = {{0, 1, 2, 3, 4}};
  EXPECT_EQ(ddp::detail::initial_buckets(p, true, 400, 1000), want);
  // With the caps: PyTorch's _compute_bucket_assignment_by_size over 0..4 gives
  // [0] [1 2 3] [4], and DDP reverses the list.
  want = {{4}, {1, 2, 3}, {0}};
  EXPECT_EQ(ddp::detail::initial_buckets(p, false, 400, 1000), want);
  // The small first cap applies to the first bucket of each dtype, as in PyTorch.
  std::vector<ParamSpec> mixed = {{100, c10::ScalarType::Float, cpu},
                                  {50, c10::ScalarType::Double, cpu},
                                  {100, c10::ScalarType::Float, cpu},
                                  {50, c10::ScalarType::Double, cpu}};
  want = {{0}, {1}, {2}, {3}};
  EXPECT_EQ(ddp::detail::assign_buckets(mixed, {0, 1, 2, 3}, 400, 10000), want);
  want = {{3}, {2}, {1}, {0}};  // reversed; dtypes never share a bucket
  EXPECT_EQ(ddp::detail::initial_buckets(mixed, false, 400, 10000), want);
}

// ---- Buffers -------------------------------------------------------------------------------

class BroadcastBuffersTest : public ::testing::TestWithParam<bool> {};

TEST_P(BroadcastBuffersTest, RunningStatsFollowRank0BeforeEachForward) {
  const bool broadcast = GetParam();
  const int world = 3;
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    ddp_test::BnNet model;
    ddp_test::init_params(*model, 19);
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg).broadcast_buffers(broadcast));
    // Different shards: after a train step every rank has its own running stats.
    dmodel(ddp_test::randn({kPerRank, 8}, 90 + r)).sum().backward();
    auto after_train = model->bn->running_mean.clone();
    auto all = pg.all_gather(after_train);
    ASSERT_FALSE(at::equal(all[0], all[1]));
    // An eval forward (grad on) does not update the stats; it only receives rank 0's.
    dmodel->eval();
    dmodel(ddp_test::randn({kPerRank, 8}, 95)).sum().backward();
    if (broadcast) {
      EXPECT_TRUE(at::equal(model->bn->running_mean, all[0])) << "rank " << r;
    } else {
      EXPECT_TRUE(at::equal(model->bn->running_mean, after_train)) << "rank " << r;
    }
    // Under NoGradGuard (e.g. evaluation on rank 0 only) nothing is exchanged: safe.
    if (r == 0) {
      at::NoGradGuard no_grad;
      dmodel(ddp_test::randn({kPerRank, 8}, 96));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(OnOff, BroadcastBuffersTest, ::testing::Bool());

// ---- The wrapper ---------------------------------------------------------------------------

namespace {

struct TwoOutputsImpl : torch::nn::Module {
  TwoOutputsImpl()
      : a(register_module("a", torch::nn::Linear(8, 4))),
        b(register_module("b", torch::nn::Linear(8, 4))),
        unused(register_module("unused", torch::nn::Linear(8, 4))) {}
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x, double scale) {
    return {a(x) * scale, b(x)};
  }
  torch::nn::Linear a, b, unused;
};
TORCH_MODULE(TwoOutputs);

}  // namespace

TEST(WrapperTest, ForwardsAnyArgumentsAndExposesTheModule) {
  ddp_test::TempDir dir;
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    TwoOutputs model;
    ddp_test::init_params(*model, 20);
    // find_unused_parameters walks the graph from both tuple elements.
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg).find_unused_parameters(true));
    static_assert(std::is_same<decltype(dmodel), ddp::DistributedDataParallel<TwoOutputs>>::value,
                  "CTAD picks the wrapped holder type");
    auto x = ddp_test::randn({4, 8}, 97);
    auto out1 = dmodel(x, 2.0);
    auto out2 = dmodel->forward(x, 2.0);
    EXPECT_TRUE(at::equal(std::get<0>(out1), std::get<0>(out2)));
    EXPECT_TRUE(at::equal(std::get<0>(out1), model->a(x) * 2.0));
    (std::get<0>(out2).sum() + std::get<1>(out2).sum()).backward();
    EXPECT_TRUE(model->a->weight.grad().defined());
    EXPECT_TRUE(model->b->weight.grad().defined());
    EXPECT_FALSE(model->unused->weight.grad().defined());

    // module() is the holder itself; parameters are shared; names carry "module.".
    EXPECT_EQ(dmodel->module().ptr().get(), model.ptr().get());
    EXPECT_EQ(dmodel->parameters().size(), model->parameters().size());
    EXPECT_TRUE(dmodel->named_parameters().contains("module.a.weight"));
    if (pg.rank() == 0) {
      torch::save(dmodel->module(), dir.file("model.pt"));
      TwoOutputs loaded;
      torch::load(loaded, dir.file("model.pt"));
      EXPECT_TRUE(at::equal(loaded->a->weight, model->a->weight));
    }
  });
}

TEST(WrapperTest, AcceptsSharedPtrModulesAndSequential) {
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto impl = std::make_shared<ddp_test::MlpImpl>();
    auto d1 = ddp::DistributedDataParallel(impl, options_for(pg));
    EXPECT_EQ(d1->module().get(), impl.get());
    d1(ddp_test::randn({2, 8}, 1)).sum().backward();

    torch::nn::Sequential seq(torch::nn::Linear(8, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
    auto d2 = ddp::DistributedDataParallel(seq, options_for(pg));
    d2(ddp_test::randn({2, 8}, 2)).sum().backward();
    EXPECT_EQ(d2->last_iteration_stats().iteration, 1);
  });
}

TEST(WrapperTest, DestructorRemovesEveryHook) {
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp model;
    // Hold the accumulators ourselves, so they outlive DDP and can be inspected.
    std::vector<decltype(torch::autograd::impl::grad_accumulator(at::Tensor()))> accs;
    std::vector<size_t> before;
    for (auto& p : model->parameters()) {
      accs.push_back(torch::autograd::impl::grad_accumulator(p));
      before.push_back(accs.back()->post_hooks().size());
    }
    {
      auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
      for (size_t i = 0; i < accs.size(); ++i) {
        EXPECT_EQ(accs[i]->post_hooks().size(), before[i] + 1) << i;
      }
    }
    for (size_t i = 0; i < accs.size(); ++i) EXPECT_EQ(accs[i]->post_hooks().size(), before[i]);
    // The bare module trains as if DDP had never been there.
    model(ddp_test::randn({2, 8}, 3)).sum().backward();
    EXPECT_TRUE(model->fc1->weight.grad().defined());
  });
}

// ---- World size 1 ------------------------------------------------------------------------

TEST(WorldSizeOneTest, IdenticalToPlainTrainingWithoutCommunication) {
  run_thread_groups(1, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp plain, wrapped;
    ddp_test::init_params(*plain, 21);
    ddp_test::init_params(*wrapped, 21);
    auto dmodel = ddp::DistributedDataParallel(wrapped, options_for(pg));
    torch::optim::SGD o1(plain->parameters(), 0.1), o2(wrapped->parameters(), 0.1);
    for (int step = 0; step < 3; ++step) {
      auto x = ddp_test::randn({8, 8}, 300 + step);
      auto y = ddp_test::randn({8, 4}, 400 + step);
      o1.zero_grad();
      ddp_test::mse(plain(x), y).backward();
      o1.step();
      o2.zero_grad();
      ddp_test::mse(dmodel(x), y).backward();
      o2.step();
    }
    auto a = plain->parameters(), b = wrapped->parameters();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << i;
    // The reducer ran (hooks and checks), but nothing was sent.
    const auto stats = dmodel->last_iteration_stats();
    EXPECT_EQ(stats.iteration, 3);
    EXPECT_TRUE(stats.bucket_bytes.empty());
  });
}

// ---- Stats ---------------------------------------------------------------------------------

TEST(StatsTest, CountsBucketsBytesAndOverlap) {
  const int world = 2;
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    // A 4-layer MLP (64x64 weights of 16 KiB, biases of 256 B) with a cap of ~210 bytes:
    // every parameter gets its own bucket, 8 in all.
    torch::nn::Sequential net(torch::nn::Linear(64, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, 64));
    auto dmodel = ddp::DistributedDataParallel(net, options_for(pg).bucket_cap_mb(0.0002));
    int64_t total_bytes = 0;
    for (auto& p : net->parameters()) total_bytes += p.numel() * 4;
    for (int it = 0; it < 3; ++it) {
      dmodel(ddp_test::randn({16, 64}, 500 + r)).sum().backward();
      const auto s = dmodel->last_iteration_stats();
      EXPECT_EQ(s.iteration, it + 1);
      EXPECT_EQ(s.num_buckets, it == 0 ? 1u : 8u);  // one initial bucket, then rebuilt
      EXPECT_EQ(s.num_buckets, dmodel->bucket_indices().size());
      EXPECT_EQ(s.buckets_launched_before_end, s.num_buckets);  // all launched from hooks
      EXPECT_LE(s.buckets_done_before_end, s.num_buckets);
      ASSERT_EQ(s.bucket_bytes.size(), s.num_buckets);
      int64_t sum = 0;
      for (auto b : s.bucket_bytes) sum += b;
      EXPECT_EQ(sum, total_bytes);
      ASSERT_EQ(s.bucket_allreduce_ms.size(), s.num_buckets);
      double total = 0;
      for (double ms : s.bucket_allreduce_ms) {
        EXPECT_GE(ms, 0.0);
        total += ms;
      }
      EXPECT_NEAR(s.allreduce_total_ms, total, 1e-9);
      EXPECT_GT(s.allreduce_total_ms, 0.0);
      EXPECT_GE(s.wait_ms, 0.0);
      EXPECT_GE(s.backward_ms, 0.0);
      if (r == 0 && it == 2) {
        std::printf("[stats] buckets %zu, launched before end %zu, done before end %zu, "
                    "wait %.3f ms, all-reduce total %.3f ms, backward %.3f ms\n",
                    s.num_buckets, s.buckets_launched_before_end, s.buckets_done_before_end,
                    s.wait_ms, s.allreduce_total_ms, s.backward_ms);
      }
    }
  });
}

}  // namespace ddp_features_test
