// ddp::SyncBatchNorm and ddp::convert_sync_batchnorm. The reference throughout is one
// torch::nn::BatchNorm in one process over the concatenation of every rank's batch:
// its output and input gradient (the rank's rows), its weight and bias gradients (the
// sum of the ranks' shares) and its running statistics must be what each rank gets.
// Batches differ in size between ranks (rank r has 2 + r samples, or 0), so averaging
// the ranks' statistics instead of weighting them by count fails these tests.

#include "parallel/ddp_test_util.h"
#include "support/util.h"

#include "distributed/comm.h"
#include "distributed/rendezvous/rendezvous.h"

#include <ddp/distributed/groups.h>
#include <ddp/nn/sync_batchnorm.h>

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/optim/sgd.h>

#include <atomic>
#include <fstream>
#include <sstream>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace sync_batchnorm_test {

using ddp_test::borrow;
using ddp_test::error_of;

namespace {

constexpr int64_t kChannels = 3;
constexpr double kTol = 1e-5;

enum class Layout { kNC, kNCL, kNCHW };

/// Elementwise |got - want| <= kTol * (1 + |want|), shapes equal.
void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!want.defined()) return;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  if (want.numel() == 0) return;
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  const double worst = ((g - w).abs() - kTol * (1 + w.abs())).max().item<double>();
  EXPECT_LE(worst, 0.0) << what << ": differs by up to " << (g - w).abs().max().item<double>();
}

std::vector<int64_t> input_shape(Layout layout, int64_t n) {
  switch (layout) {
    case Layout::kNC:
      return {n, kChannels};
    case Layout::kNCL:
      return {n, kChannels, 5};
    case Layout::kNCHW:
      return {n, kChannels, 3, 4};
  }
  return {};
}

/// Non-default values everywhere, so that a wrong update formula shows.
template <typename Layer>
void init_state(Layer& layer) {
  at::NoGradGuard no_grad;
  if (layer->weight.defined()) {
    layer->weight.copy_(1 + 0.3 * ddp_test::randn({kChannels}, 1));
    layer->bias.copy_(0.3 * ddp_test::randn({kChannels}, 2));
  }
  if (layer->running_mean.defined()) {
    layer->running_mean.copy_(0.2 * ddp_test::randn({kChannels}, 3));
    layer->running_var.copy_(1 + ddp_test::randn({kChannels}, 4).abs());
  }
}

struct StepResult {
  at::Tensor output, grad_input, grad_weight, grad_bias;
};

struct RunResult {
  std::vector<StepResult> steps;
  at::Tensor running_mean, running_var, num_batches_tracked;
};

/// Forward and backward of loss = sum(y * g) for each (x, g), in training mode.
template <typename Layer>
RunResult run_layer(Layer& layer, const std::vector<at::Tensor>& xs,
                    const std::vector<at::Tensor>& gs) {
  RunResult r;
  for (size_t s = 0; s < xs.size(); ++s) {
    if (layer->weight.defined()) {
      layer->weight.mutable_grad() = at::Tensor();
      layer->bias.mutable_grad() = at::Tensor();
    }
    at::Tensor x = xs[s].clone().requires_grad_(true);
    at::Tensor y = layer->forward(x);
    (y * gs[s]).sum().backward();
    r.steps.push_back({y.detach(), x.grad(),
                       layer->weight.defined() ? layer->weight.grad() : at::Tensor(),
                       layer->bias.defined() ? layer->bias.grad() : at::Tensor()});
  }
  if (layer->running_mean.defined()) {
    r.running_mean = layer->running_mean.clone();
    r.running_var = layer->running_var.clone();
    r.num_batches_tracked = layer->num_batches_tracked.clone();
  }
  return r;
}

struct Case {
  std::string name;
  int world = 2;
  Layout layout = Layout::kNC;
  std::vector<int64_t> sizes;  // per rank; empty: 2 + rank
  c10::optional<double> momentum = 0.1;
  bool affine = true;
  bool track = true;
  int steps = 2;

  int64_t size_of(int rank) const { return sizes.empty() ? 2 + rank : sizes[rank]; }
  int64_t offset_of(int rank) const {
    int64_t o = 0;
    for (int r = 0; r < rank; ++r) o += size_of(r);
    return o;
  }
  int64_t total() const { return offset_of(world); }
  ddp::SyncBatchNormOptions options() const {
    return ddp::SyncBatchNormOptions(kChannels)
        .momentum(momentum)
        .affine(affine)
        .track_running_stats(track);
  }
};

/// Inputs of the whole batch (mean 3, spread 0.5: a mean large against the spread) and
/// upstream gradients, one per step.
void make_data(const Case& c, uint64_t seed, std::vector<at::Tensor>* xs,
               std::vector<at::Tensor>* gs) {
  for (int s = 0; s < c.steps; ++s) {
    xs->push_back(3 + 0.5 * ddp_test::randn(input_shape(c.layout, c.total()), seed + 2 * s));
    gs->push_back(ddp_test::randn(input_shape(c.layout, c.total()), seed + 2 * s + 1));
  }
}

RunResult reference(const Case& c, const std::vector<at::Tensor>& xs,
                    const std::vector<at::Tensor>& gs) {
  const auto o = torch::nn::BatchNormOptions(kChannels)
                     .momentum(c.momentum)
                     .affine(c.affine)
                     .track_running_stats(c.track);
  if (c.layout == Layout::kNCHW) {
    torch::nn::BatchNorm2d bn(o);
    init_state(bn);
    return run_layer(bn, xs, gs);
  }
  torch::nn::BatchNorm1d bn(o);
  init_state(bn);
  return run_layer(bn, xs, gs);
}

/// Runs rank `rank`'s share of the case over `pg` and compares with `ref`.
void check_rank(const Case& c, ddp::ProcessGroup& pg, int rank, const std::vector<at::Tensor>& xs,
                const std::vector<at::Tensor>& gs, const RunResult& ref) {
  ddp::SyncBatchNorm sbn(c.options().process_group(borrow(pg)));
  init_state(sbn);
  const int64_t offset = c.offset_of(rank), n = c.size_of(rank);
  std::vector<at::Tensor> mine_x, mine_g;
  for (int s = 0; s < c.steps; ++s) {
    mine_x.push_back(xs[s].narrow(0, offset, n));
    mine_g.push_back(gs[s].narrow(0, offset, n));
  }
  const RunResult got = run_layer(sbn, mine_x, mine_g);
  const std::string tag = c.name + ", rank " + std::to_string(rank);
  for (int s = 0; s < c.steps; ++s) {
    const StepResult& g = got.steps[s];
    const StepResult& w = ref.steps[s];
    const std::string at_step = tag + ", step " + std::to_string(s);
    expect_close(g.output, w.output.narrow(0, offset, n), at_step + ": output");
    expect_close(g.grad_input, w.grad_input.narrow(0, offset, n), at_step + ": input grad");
    if (c.affine) {
      // Each rank holds its share; together they are the whole batch's gradient.
      at::Tensor gw = g.grad_weight.clone(), gb = g.grad_bias.clone();
      pg.all_reduce(gw);
      pg.all_reduce(gb);
      expect_close(gw, w.grad_weight, at_step + ": weight grad (sum over ranks)");
      expect_close(gb, w.grad_bias, at_step + ": bias grad (sum over ranks)");
    }
  }
  expect_close(got.running_mean, ref.running_mean, tag + ": running_mean");
  expect_close(got.running_var, ref.running_var, tag + ": running_var");
  if (c.track) {
    EXPECT_EQ(got.num_batches_tracked.item<int64_t>(), c.steps) << tag;
  }
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class SyncBatchNormTest : public ::testing::TestWithParam<Case> {};

TEST_P(SyncBatchNormTest, EqualsOneBatchNormOverTheWholeBatch) {
  const Case& c = GetParam();
  std::vector<at::Tensor> xs, gs;
  make_data(c, 100, &xs, &gs);
  const RunResult ref = reference(c, xs, gs);
  ddp_test::run_thread_groups(c.world, [&](ddp::ProcessGroup& pg) {
    check_rank(c, pg, pg.rank(), xs, gs, ref);
  });
}

Case named(std::string name, int world, Layout layout) {
  Case c;
  c.name = std::move(name);
  c.world = world;
  c.layout = layout;
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (int world : {2, 3}) {
    const std::string w = "World" + std::to_string(world);
    all.push_back(named(w + "NC", world, Layout::kNC));
    all.push_back(named(w + "NCL", world, Layout::kNCL));
    all.push_back(named(w + "NCHW", world, Layout::kNCHW));
  }
  Case cumulative = named("CumulativeMomentum", 2, Layout::kNCHW);
  cumulative.momentum = c10::nullopt;
  cumulative.steps = 3;
  all.push_back(cumulative);
  Case plain = named("NotAffine", 3, Layout::kNCL);
  plain.affine = false;
  all.push_back(plain);
  Case untracked = named("NoRunningStats", 2, Layout::kNC);
  untracked.track = false;
  all.push_back(untracked);
  Case empty = named("RankWithEmptyBatch", 3, Layout::kNCHW);
  empty.sizes = {3, 0, 2};
  all.push_back(empty);
  return all;
}

INSTANTIATE_TEST_SUITE_P(Cases, SyncBatchNormTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// ---- Communication, or none ---------------------------------------------------------

/// A real Gloo group that counts the collectives issued on it.
class CountingComm final : public ddp::detail::Comm {
 public:
  explicit CountingComm(std::unique_ptr<Comm> inner)
      : Comm(inner->config()), inner_(std::move(inner)) {}
  std::shared_ptr<ddp::detail::PendingWork> all_reduce(std::vector<at::Tensor>& tensors,
                                                       ddp::ReduceOp op) override {
    ++all_reduces;
    return inner_->all_reduce(tensors, op);
  }
  std::shared_ptr<ddp::detail::PendingWork> broadcast(std::vector<at::Tensor>& tensors,
                                                      int src) override {
    ++others;
    return inner_->broadcast(tensors, src);
  }
  std::shared_ptr<ddp::detail::PendingWork> all_gather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs) override {
    ++all_gathers;
    return inner_->all_gather(outputs, inputs);
  }
  void barrier() override { inner_->barrier(); }
  void shutdown() override { inner_->shutdown(); }

  std::atomic<int> all_reduces{0}, all_gathers{0}, others{0};

 private:
  std::unique_ptr<Comm> inner_;
};

TEST(SyncBatchNormCommTest, OneAllGatherPerForwardOneAllReducePerBackwardNoneInEval) {
  constexpr int kWorld = 2;
  ddp_test::TempDir dir;
  ddp_test::run_threads(kWorld, [&](int rank) {
    auto owned = std::make_unique<CountingComm>(ddp::detail::Comm::create(
        ddp::detail::resolve_rendezvous(ddp_test::file_init(dir, rank, kWorld))));
    CountingComm* comm = owned.get();
    std::shared_ptr<ddp::ProcessGroup> pg = ddp::detail::make_process_group(std::move(owned));
    ddp::SyncBatchNorm sbn(ddp::SyncBatchNormOptions(kChannels).process_group(pg));
    torch::nn::BatchNorm1d bn(kChannels);
    init_state(sbn);
    init_state(bn);
    const at::Tensor x = ddp_test::randn({4, kChannels}, 7 + rank).requires_grad_(true);

    sbn->eval();
    bn->eval();
    EXPECT_TRUE(at::equal(sbn(x), bn(x)));
    EXPECT_EQ(comm->all_gathers + comm->all_reduces + comm->others, 0);

    sbn->train();
    at::Tensor y = sbn(x);
    EXPECT_EQ(comm->all_gathers, 2);  // the channel handshake, then the statistics
    EXPECT_EQ(comm->all_reduces, 0);
    y.sum().backward();
    EXPECT_EQ(comm->all_reduces, 1);
    sbn(x).sum().backward();
    EXPECT_EQ(comm->all_gathers, 3);
    EXPECT_EQ(comm->all_reduces, 2);
    EXPECT_EQ(comm->others, 0);

    // Eval needs no group at all: it still works once the group is gone; training
    // says what is wrong.
    pg->barrier();
    pg->shutdown();
    sbn->eval();
    {
      at::NoGradGuard no_grad;
      bn->running_mean.copy_(sbn->running_mean);
      bn->running_var.copy_(sbn->running_var);
    }
    EXPECT_TRUE(at::equal(sbn(x), bn(x)));
    sbn->train();
    EXPECT_ERROR_HAS(error_of([&] { sbn(x); }), "shut down");
  });
}

TEST(SyncBatchNormCommTest, WorldSizeOneAndNoGroupAreBatchNorm) {
  const at::Tensor x = 2 + ddp_test::randn({6, kChannels, 4}, 8);
  auto expect_batchnorm = [&](ddp::SyncBatchNorm sbn) {
    torch::nn::BatchNorm1d bn(kChannels);
    init_state(sbn);
    init_state(bn);
    for (int step = 0; step < 2; ++step) {
      at::Tensor xs = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
      at::Tensor ys = sbn(xs), yb = bn(xb);
      EXPECT_TRUE(at::equal(ys, yb));
      ys.pow(2).sum().backward();
      yb.pow(2).sum().backward();
      EXPECT_TRUE(at::equal(xs.grad(), xb.grad()));
    }
    EXPECT_TRUE(at::equal(sbn->weight.grad(), bn->weight.grad()));
    EXPECT_TRUE(at::equal(sbn->running_var, bn->running_var));
    EXPECT_TRUE(at::equal(sbn->num_batches_tracked, bn->num_batches_tracked));
  };
  ASSERT_FALSE(ddp::is_initialized());
  expect_batchnorm(ddp::SyncBatchNorm(kChannels));  // no default group: one process
  ddp_test::run_thread_groups(1, [&](ddp::ProcessGroup& pg) {
    expect_batchnorm(
        ddp::SyncBatchNorm(ddp::SyncBatchNormOptions(kChannels).process_group(borrow(pg))));
  });
}

TEST(SyncBatchNormCommTest, SubgroupsNormaliseOnlyTheirOwnRanks) {
  // Four ranks in two groups of two made by new_subgroups ({0, 1} and {2, 3}): each
  // pair's result is one BatchNorm over that pair's batch, not over all four.
  Case c = named("Subgroup", 2, Layout::kNCL);
  c.sizes = {2, 3};
  std::vector<at::Tensor> xs[2], gs[2];
  RunResult refs[2];
  for (int pair = 0; pair < 2; ++pair) {
    make_data(c, 200 + 10 * pair, &xs[pair], &gs[pair]);
    refs[pair] = reference(c, xs[pair], gs[pair]);
  }
  ddp_test::run_thread_groups(4, [&](ddp::ProcessGroup& world) {
    const int pair = world.rank() / 2;
    auto mine = ddp::new_subgroups(2, ddp::GroupOptions(), borrow(world)).first;
    check_rank(c, *mine, mine->rank(), xs[pair], gs[pair], refs[pair]);
  });
}

// ---- Reduced precision ---------------------------------------------------------------

TEST(SyncBatchNormPrecisionTest, BFloat16InputGivesTheFloat32ResultWithFloat32Statistics) {
  // A mean of about 300, which bfloat16 holds only to a step of 2, and output gradients
  // of about 100 with a spread of 1: a mean taken in bfloat16, or backward's sums taken
  // in bfloat16, is off by far more than rounding the results to bfloat16 is (PyTorch's
  // batch_norm_stats and batch_norm_backward_reduce return float32 for these inputs).
  constexpr int kWorld = 2;
  ddp_test::run_thread_groups(kWorld, [&](ddp::ProcessGroup& pg) {
    const int rank = pg.rank();
    const at::Tensor x16 =
        (300 + ddp_test::randn({8, kChannels, 16}, 40 + rank) * 0.5).to(at::kBFloat16);
    const at::Tensor dy16 =
        (100 + ddp_test::randn({8, kChannels, 16}, 50 + rank)).to(at::kBFloat16);
    ddp::SyncBatchNorm half(ddp::SyncBatchNormOptions(kChannels).process_group(borrow(pg)));
    ddp::SyncBatchNorm full(ddp::SyncBatchNormOptions(kChannels).process_group(borrow(pg)));
    init_state(half);
    init_state(full);
    const at::Tensor xh = x16.clone().requires_grad_(true);
    const at::Tensor xf = x16.to(at::kFloat).requires_grad_(true);
    const at::Tensor yh = half(xh), yf = full(xf);
    EXPECT_EQ(yh.scalar_type(), at::kBFloat16);
    (yh.to(at::kFloat) * dy16.to(at::kFloat)).sum().backward();
    (yf * dy16.to(at::kFloat)).sum().backward();
    // bfloat16 keeps 8 bits: results of magnitude up to ~5 round by up to 2^-6 of it.
    auto close = [](const at::Tensor& got, const at::Tensor& want, const char* what) {
      const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
      const double worst = ((g - w).abs() - 0.02 * (1 + w.abs())).max().item<double>();
      EXPECT_LE(worst, 0.0) << what << ": bfloat16 differs from float32 by up to "
                            << (g - w).abs().max().item<double>();
    };
    close(yh, yf, "output");
    close(xh.grad(), xf.grad(), "input gradient");
    close(half->running_mean, full->running_mean, "running mean");
    close(half->running_var, full->running_var, "running variance");
  });
}

// ---- Errors -----------------------------------------------------------------------------

TEST(SyncBatchNormErrorsTest, LocalMistakesNameWhatWasExpected) {
  EXPECT_ERROR_HAS(error_of([] { ddp::SyncBatchNorm(0); }), "num_features must be > 0, but got 0");
  EXPECT_ERROR_HAS(error_of([] { ddp::SyncBatchNorm(ddp::SyncBatchNormOptions(2).momentum(1.5)); }),
                   "momentum must be in [0, 1]");
  ddp::SyncBatchNorm sbn(kChannels);
  EXPECT_ERROR_HAS(error_of([&] { sbn(at::ones({kChannels})); }),
                   "at least 2 dimensions, but got 1-D input of shape [3]");
  EXPECT_ERROR_HAS(error_of([&] {
                     sbn(at::ones({4, 5}));
                   }),
                   "expected 3 channels (num_features) in dimension 1 of its input, but got 5");
}

TEST(SyncBatchNormErrorsTest, RanksWithDifferentChannelCountsAllGetAMismatchError) {
  ddp_test::run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    const int64_t channels = pg.rank() == 0 ? 4 : 3;
    ddp::SyncBatchNorm sbn(ddp::SyncBatchNormOptions(channels).process_group(borrow(pg)));
    const std::string error = error_of([&] { sbn(at::randn({2, channels})); });
    EXPECT_ERROR_HAS(error, "rank " + std::to_string(pg.rank()) + " of 2");
    EXPECT_ERROR_HAS(error, "rank 0 has 4, rank 1 has 3");
    EXPECT_THROW(sbn(at::randn({2, channels})), ddp::MismatchError);
  });
}

TEST(SyncBatchNormErrorsTest, OneValuePerChannelAcrossAllRanksFailsOnEveryRank) {
  ddp_test::run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    ddp::SyncBatchNorm sbn(ddp::SyncBatchNormOptions(kChannels).process_group(borrow(pg)));
    const at::Tensor x = at::randn({pg.rank() == 0 ? 1 : 0, kChannels});
    EXPECT_ERROR_HAS(error_of([&] { sbn(x); }), "more than 1 value per channel");
  });
}

// ---- convert_sync_batchnorm -----------------------------------------------------------

struct InnerImpl : torch::nn::Module {
  InnerImpl() { register_module("bn", torch::nn::BatchNorm3d(2)); }  // reached by name
};
TORCH_MODULE(Inner);

/// BatchNorm layers at every kind of place: Sequential, ModuleList, ModuleDict, and a
/// nested module's registry.
struct NestedImpl : torch::nn::Module {
  NestedImpl()
      : block(register_module(
            "block", torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3)),
                                           torch::nn::BatchNorm2d(3), torch::nn::ReLU()))),
        list(register_module("list",
                             torch::nn::ModuleList(torch::nn::BatchNorm1d(
                                                       torch::nn::BatchNormOptions(4).eps(1e-3)),
                                                   torch::nn::Linear(4, 4)))),
        dict(register_module(
            "dict",
            torch::nn::ModuleDict(std::vector<std::pair<std::string, std::shared_ptr<Module>>>{
                {"bn", torch::nn::BatchNorm1d(
                           torch::nn::BatchNormOptions(5).momentum(c10::nullopt).affine(false))
                           .ptr()}}))),
        inner(register_module("inner", Inner())) {}
  torch::nn::Sequential block;
  torch::nn::ModuleList list;
  torch::nn::ModuleDict dict;
  Inner inner;
};
TORCH_MODULE(Nested);

bool is_batchnorm(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m);
}

std::shared_ptr<ddp::SyncBatchNormImpl> as_sync(const std::shared_ptr<torch::nn::Module>& m) {
  return std::dynamic_pointer_cast<ddp::SyncBatchNormImpl>(m);
}

TEST(ConvertSyncBatchNormTest, ReplacesEveryBatchNormKeepingKeysTensorsAndFlags) {
  Nested net;
  {
    at::NoGradGuard no_grad;
    uint64_t seed = 30;
    for (auto& p : net->parameters()) p.copy_(ddp_test::randn(p.sizes(), seed++));
    for (auto& b : net->named_buffers()) {
      if (b.key().find("num_batches_tracked") != std::string::npos) {
        b.value().fill_(7);
      } else {
        b.value().copy_(ddp_test::randn(b.value().sizes(), seed++).abs());
      }
    }
  }
  net->list->ptr(0)->eval();
  const auto params_before = net->named_parameters();
  const auto buffers_before = net->named_buffers();

  Nested same = ddp::convert_sync_batchnorm(net);
  EXPECT_EQ(same.ptr(), net.ptr());

  // The same keys in the same order, holding the very same tensors (as PyTorch shares
  // them): values are kept and an optimizer built before still updates them.
  auto expect_same = [](const torch::OrderedDict<std::string, at::Tensor>& after,
                        const torch::OrderedDict<std::string, at::Tensor>& before) {
    ASSERT_EQ(after.keys(), before.keys());
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_TRUE(after[i].value().is_same(before[i].value())) << after[i].key();
    }
  };
  expect_same(net->named_parameters(), params_before);
  expect_same(net->named_buffers(), buffers_before);

  // No BatchNorm left in the registry, and the containers' own lists (what their
  // forward runs) hold the new layers.
  for (const auto& m : net->named_modules()) EXPECT_FALSE(is_batchnorm(*m.value())) << m.key();
  const auto sequential_bn = as_sync(net->block->ptr(1));
  const auto list_bn = as_sync(net->list->ptr(0));
  const auto dict_bn = as_sync(net->dict["bn"]);
  const auto inner_bn = as_sync(net->inner->named_children()["bn"]);
  ASSERT_TRUE(sequential_bn && list_bn && dict_bn && inner_bn);
  EXPECT_EQ(sequential_bn, as_sync(net->block->named_children()["1"]));
  EXPECT_EQ(list_bn, as_sync(net->list->named_children()["0"]));
  EXPECT_EQ(dict_bn, as_sync(net->dict->named_children()["bn"]));

  EXPECT_FALSE(list_bn->is_training());
  EXPECT_TRUE(sequential_bn->is_training());
  EXPECT_EQ(list_bn->options.eps(), 1e-3);
  EXPECT_FALSE(dict_bn->options.momentum().has_value());
  EXPECT_FALSE(dict_bn->options.affine());
  EXPECT_EQ(inner_bn->options.num_features(), 2);
  EXPECT_EQ(sequential_bn->options.process_group(), nullptr);

  // The Sequential's forward runs through the new layer (no group: a plain BatchNorm).
  EXPECT_EQ(net->block->forward(at::randn({2, 2, 5, 5})).sizes(), (at::IntArrayRef{2, 3, 3, 3}));
  EXPECT_EQ(sequential_bn->num_batches_tracked.item<int64_t>(), 8);
}

TEST(ConvertSyncBatchNormTest, RootBatchNormReturnsTheNewLayer) {
  ddp_test::TempDir dir;
  torch::nn::BatchNorm2d bn(
      torch::nn::BatchNormOptions(3).momentum(0.3).track_running_stats(false));
  bn->eval();
  auto group = ddp::ProcessGroup::create(ddp_test::file_init(dir, 0, 1));
  const auto converted = as_sync(ddp::convert_sync_batchnorm(bn.ptr(), group));
  ASSERT_TRUE(converted);
  EXPECT_EQ(converted->options.process_group(), group);
  EXPECT_EQ(converted->options.momentum().value(), 0.3);
  EXPECT_FALSE(converted->options.track_running_stats());
  EXPECT_FALSE(converted->is_training());
  EXPECT_TRUE(converted->weight.is_same(bn->weight));
  EXPECT_EQ(converted->named_parameters().keys(), bn->named_parameters().keys());
  EXPECT_TRUE(converted->named_buffers().is_empty());
  EXPECT_TRUE(bn->named_buffers().is_empty());
}

struct TypedFieldImpl : torch::nn::Module {
  TypedFieldImpl()
      : seq(register_module("seq", torch::nn::Sequential(torch::nn::BatchNorm1d(4)))),
        bn(register_module("bn", torch::nn::BatchNorm1d(4))) {}
  at::Tensor forward(const at::Tensor& x) { return bn(seq->forward(x)); }
  torch::nn::Sequential seq;
  torch::nn::BatchNorm1d bn;  // forward calls this field: it cannot be re-pointed
};
TORCH_MODULE(TypedField);

TEST(ConvertSyncBatchNormTest, ABatchNormHeldByATypedFieldIsRefusedAndNothingChanges) {
  TypedField net;
  const std::string error = error_of([&] { ddp::convert_sync_batchnorm(net); });
  EXPECT_ERROR_HAS(error, "at 'bn' is also held outside the module tree");
  EXPECT_ERROR_HAS(error, "Declare the field as ddp::SyncBatchNorm");
  EXPECT_ERROR_HAS(error, "Nothing was converted");
  EXPECT_TRUE(is_batchnorm(*net->seq->ptr(0)));
  EXPECT_TRUE(is_batchnorm(*net->named_children()["bn"]));
}

TEST(ConvertSyncBatchNormTest, CloneAndPrint) {
  ddp::SyncBatchNorm sbn(kChannels);
  init_state(sbn);
  const auto copy = std::dynamic_pointer_cast<ddp::SyncBatchNormImpl>(sbn->clone());
  ASSERT_TRUE(copy);
  EXPECT_FALSE(copy->weight.is_same(sbn->weight));
  EXPECT_TRUE(at::equal(copy->weight, sbn->weight));
  EXPECT_TRUE(at::equal(copy->running_var, sbn->running_var));
  std::ostringstream s;
  s << *sbn;
  EXPECT_EQ(s.str(), "ddp::SyncBatchNorm(3, eps=1e-05, momentum=0.1, affine=true, "
                     "track_running_stats=true)");
}

// ---- Under DistributedDataParallel --------------------------------------------------------

struct ConvBnNetImpl : torch::nn::Module {
  ConvBnNetImpl()
      : features(register_module(
            "features", torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)),
                                              torch::nn::BatchNorm2d(4), torch::nn::ReLU()))),
        head(register_module("head", torch::nn::Linear(4 * 6 * 6, 3))) {}
  at::Tensor forward(const at::Tensor& x) { return head(features->forward(x).flatten(1)); }
  torch::nn::Sequential features;
  torch::nn::Linear head;
};
TORCH_MODULE(ConvBnNet);

constexpr int64_t kPerRank = 4;
constexpr int kSteps = 3;

void train(ConvBnNet& net, const std::function<at::Tensor(const at::Tensor&)>& forward,
           const at::Tensor& x, const at::Tensor& y) {
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    ddp_test::mse(forward(x[s]), y[s]).backward();
    opt.step();
  }
}

class SyncBatchNormDdpTest : public ::testing::TestWithParam<int> {};

TEST_P(SyncBatchNormDdpTest, TrainingEqualsOneProcessOnTheWholeBatch) {
  const int world = GetParam();
  const at::Tensor x = ddp_test::randn({kSteps, world * kPerRank, 1, 8, 8}, 40);
  const at::Tensor y = ddp_test::randn({kSteps, world * kPerRank, 3}, 41);
  ConvBnNet ref;
  ddp_test::init_params(*ref, 42);
  train(
      ref, [&](const at::Tensor& xs) { return ref->forward(xs); }, x, y);
  const auto want_params = ref->named_parameters();
  const auto want_buffers = ref->named_buffers();

  ddp_test::run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    const at::Tensor xs = x.narrow(1, r * kPerRank, kPerRank);
    const at::Tensor ys = y.narrow(1, r * kPerRank, kPerRank);
    for (bool sync : {true, false}) {
      ConvBnNet net;
      ddp_test::init_params(*net, 42);
      if (sync) ddp::convert_sync_batchnorm(net, borrow(pg));
      // One bucket per parameter: the head's buckets are launched before the
      // SyncBatchNorm backward issues its all-reduce on the same group, and the rest
      // after it (Note [Collective order]).
      auto dmodel =
          ddp::DistributedDataParallel(net, ddp_test::options_for(pg).bucket_cap_mb(1e-6));
      train(
          net, [&](const at::Tensor& in) { return dmodel(in); }, xs, ys);
      const auto params = net->named_parameters();
      const auto buffers = net->named_buffers();
      ASSERT_EQ(params.keys(), want_params.keys());
      ASSERT_EQ(buffers.keys(), want_buffers.keys());
      if (sync) {
        for (const auto& p : want_params) expect_close(params[p.key()], p.value(), p.key());
        for (const auto& b : want_buffers) expect_close(buffers[b.key()], b.value(), b.key());
      } else {
        // The control: per-rank BatchNorm statistics give other weights, so the
        // comparison above can fail.
        double worst = 0;
        for (const auto& p : want_params) {
          worst = std::max(worst, (params[p.key()] - p.value()).abs().max().item<double>());
        }
        EXPECT_GT(worst, 1e-4);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SyncBatchNormDdpTest, ::testing::Values(2, 3));

// DDP with SyncBatchNorm, both on a group made by new_subgroups: two 2-rank jobs at once,
// each equal to one process on its whole batch.
TEST(SyncBatchNormDdpSubgroupTest, TwoJobsOnSubgroupsEachEqualOneProcess) {
  constexpr int world = 2;
  const at::Tensor x = ddp_test::randn({kSteps, world * kPerRank, 1, 8, 8}, 43);
  const at::Tensor y = ddp_test::randn({kSteps, world * kPerRank, 3}, 44);
  ConvBnNet ref;
  ddp_test::init_params(*ref, 45);
  train(
      ref, [&](const at::Tensor& xs) { return ref->forward(xs); }, x, y);
  ddp_test::run_subgroup_copies(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    ConvBnNet net;
    ddp_test::init_params(*net, 45);
    ddp::convert_sync_batchnorm(net, borrow(pg));
    auto dmodel = ddp::DistributedDataParallel(net, ddp_test::options_for(pg));
    train(
        net, [&](const at::Tensor& in) { return dmodel(in); }, x.narrow(1, r * kPerRank, kPerRank),
        y.narrow(1, r * kPerRank, kPerRank));
    const auto params = net->named_parameters();
    const auto buffers = net->named_buffers();
    for (const auto& p : ref->named_parameters()) expect_close(params[p.key()], p.value(), p.key());
    for (const auto& b : ref->named_buffers()) expect_close(buffers[b.key()], b.value(), b.key());
  });
}

// ---- A converted model's state dict in PyTorch --------------------------------------------

TEST(SyncBatchNormPythonTest, StateDictLoadsIntoTorchBatchNorm2d) {
  // Two ranks train a converted Sequential(Conv2d, BatchNorm2d, ReLU) for two steps
  // (batches of 3 and 2), so the running statistics are the whole batch's. Python loads
  // rank 0's state dict, strictly, into nn.Sequential(nn.Conv2d, nn.BatchNorm2d, nn.ReLU)
  // and must give the same eval output.
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3)),
                                 torch::nn::BatchNorm2d(3), torch::nn::ReLU());
  };
  const at::Tensor x = 1 + ddp_test::randn({2, 5, 2, 6, 6}, 50);
  torch::nn::Sequential trained = nullptr;
  ddp_test::run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto net = make();
    ddp_test::init_params(*net, 51);
    ddp::convert_sync_batchnorm(net, borrow(pg));
    const int64_t offset = pg.rank() == 0 ? 0 : 3, n = pg.rank() == 0 ? 3 : 2;
    for (int s = 0; s < 2; ++s) net->forward(x[s].narrow(0, offset, n)).sum().backward();
    if (pg.rank() == 0) trained = net;
  });
  ASSERT_FALSE(trained.is_empty());
  // Eval mode never touches the group, which is gone now (its pointer was borrowed).
  trained->eval();
  const at::Tensor probe = ddp_test::randn({2, 2, 6, 6}, 52);
  const at::Tensor out = trained->forward(probe);

  c10::Dict<std::string, at::Tensor> state;
  for (const auto& p : trained->named_parameters()) state.insert(p.key(), p.value().detach());
  for (const auto& b : trained->named_buffers()) state.insert(b.key(), b.value());
  ddp_test::TempDir dir;
  {
    const std::vector<char> bytes = torch::jit::pickle_save(state);
    std::ofstream f(dir.file("state.pt"), std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(f.good());
  }
  ddp_test::write_floats(dir.file("probe.bin"), probe);
  ddp_test::write_floats(dir.file("out.bin"), out);

  std::string output;
  const int rc = ddp_test::run_command(std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                                           "/tests/parallel/python/sync_batchnorm_reference.py " +
                                           dir.file("state.pt") + " " + dir.file("probe.bin") +
                                           " " + dir.file("out.bin") + " 2>&1",
                                       &output);
  EXPECT_EQ(rc, 0) << output;
}

}  // namespace

}  // namespace sync_batchnorm_test
