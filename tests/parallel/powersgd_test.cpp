// ddp::powersgd_hook: its generator against numpy's, its errors, a full-rank
// approximation against plain averaging (single-process math: P Qᵀ of full rank is M),
// state_dict round trips, and PyTorch's own DDP with powerSGD_hook from the same weights
// and data (tests/parallel/python/powersgd_peer.py).

#include "parallel/ddp_test_util.h"
#include "support/suite_run.h"
#include "support/util.h"

#include <ddp/parallel/powersgd.h>
#include <ddp/serialize/checkpoint.h>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdio>
#include <fstream>
#include <sys/stat.h>
#include <sstream>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace powersgd_test {

namespace {

constexpr int64_t kPerRank = 4;

torch::nn::Sequential make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 8));
}

at::Tensor flat(torch::nn::Module& m) {
  std::vector<at::Tensor> all;
  for (auto& p : m.parameters()) all.push_back(p.detach().reshape({-1}));
  return at::cat(all);
}

void load_flat(torch::nn::Module& m, const at::Tensor& values) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : m.parameters()) {
    p.copy_(values.slice(0, offset, offset + p.numel()).view_as(p));
    offset += p.numel();
  }
}

struct PsgdRun {
  int world = 2;
  int64_t rank = 1;
  bool ef_warm = true;
  bool bucket_view = false;
  int steps = 30;
  int64_t start = 2;
  double min_compression_rate = 2;
};

// Trains the MLP with DDP and PowerSGD (or plain averaging when `powersgd` is false) in
// `run.world` thread ranks on Gloo; returns rank 0's final parameters and, through
// `stats`, the state's iter / numel before / numel after.
at::Tensor train(const PsgdRun& run, const at::Tensor& init, const at::Tensor& x,
                 const at::Tensor& y, bool powersgd, std::vector<int64_t>* stats = nullptr) {
  at::Tensor result;
  ddp_test::run_thread_groups(run.world, [&](ddp::ProcessGroup& pg) {
    auto model = make_mlp();
    load_flat(*model, init);
    auto dmodel =
        ddp::DistributedDataParallel(model, ddp_test::options_for(pg).gradient_as_bucket_view(
                                                run.bucket_view));
    auto state =
        std::make_shared<ddp::PowerSGDState>(ddp::PowerSGDState()
                                                 .matrix_approximation_rank(run.rank)
                                                 .start_powerSGD_iter(run.start)
                                                 .min_compression_rate(run.min_compression_rate)
                                                 .use_error_feedback(run.ef_warm)
                                                 .warm_start(run.ef_warm));
    if (powersgd) dmodel->register_comm_hook(ddp::powersgd_hook(state));
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
    const int r = pg.rank();
    for (int s = 0; s < run.steps; ++s) {
      for (auto& p : model->parameters()) {
        if (!run.bucket_view) {
          p.mutable_grad() = at::Tensor();
        } else if (p.grad().defined()) {
          p.mutable_grad().zero_();
        }
      }
      auto xs = x[s].slice(0, r * kPerRank, (r + 1) * kPerRank);
      auto ys = y[s].slice(0, r * kPerRank, (r + 1) * kPerRank);
      ddp_test::mse(dmodel(xs), ys).backward();
      opt.step();
    }
    if (r == 0) {
      result = flat(*model).clone();
      if (stats)
        *stats = {state->iter(), state->numel_before_compression(),
                  state->numel_after_compression()};
    }
  });
  return result;
}

struct Data {
  at::Tensor init, x, y;
};

Data make_data(int world, int steps) {
  auto model = make_mlp();
  ddp_test::init_params(*model, 301);
  return {flat(*model).clone(), ddp_test::randn({steps, world * kPerRank, 32}, 302),
          ddp_test::randn({steps, world * kPerRank, 8}, 303)};
}

}  // namespace

TEST(PowerSGDTest, GeneratorIsNumpysRandomState) {
  std::string output;
  const int rc = ddp_test::run_command(
      std::string(DDP_TEST_PYTHON) +
          " -c 'import numpy as np\n"
          "for seed in (0, 1, 12345, 4294967295):\n"
          "    r = np.random.RandomState(seed)\n"
          "    print(*[r.randint(1_000_000_000) for _ in range(700)], r.randint(7), "
          "r.randint(1), r.randint(2**32))' 2>&1",
      &output);
  if (rc != 0 && output.find("No module named") != std::string::npos) GTEST_SKIP() << output;
  ASSERT_EQ(rc, 0) << output;
  std::istringstream lines(output);
  std::string line;
  int checked = 0;
  for (uint32_t seed : {0u, 1u, 12345u, 4294967295u}) {
    ASSERT_TRUE(std::getline(lines, line)) << output;
    std::istringstream values(line);
    ddp::detail::NumpyRandomState rng(seed);
    int64_t expected = 0;
    for (int i = 0; i < 700; ++i) {  // more than one 624-word refill
      values >> expected;
      ASSERT_EQ(rng.randint(1000000000), expected) << "seed " << seed << ", draw " << i;
    }
    values >> expected;
    EXPECT_EQ(rng.randint(7), expected);
    values >> expected;
    EXPECT_EQ(rng.randint(1), expected);
    values >> expected;
    EXPECT_EQ(rng.randint(int64_t(1) << 32), expected);
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

TEST(PowerSGDTest, BadHyperparametersAreClearErrors) {
  auto error = [](ddp::PowerSGDState s) {
    return ddp_test::error_of([&] { ddp::powersgd_hook(std::make_shared<ddp::PowerSGDState>(s)); });
  };
  EXPECT_ERROR_HAS(error(ddp::PowerSGDState().matrix_approximation_rank(0)),
                   "matrix_approximation_rank must be >= 1");
  EXPECT_ERROR_HAS(error(ddp::PowerSGDState().matrix_approximation_rank(-3)), "got -3");
  const std::string start = error(ddp::PowerSGDState().start_powerSGD_iter(1));
  EXPECT_ERROR_HAS(start, "expected start_powerSGD_iter > 1");
  EXPECT_ERROR_HAS(start, "Set start_powerSGD_iter to 2 or more");
  EXPECT_ERROR_HAS(error(ddp::PowerSGDState().start_powerSGD_iter(0).warm_start(false)),
                   "use_error_feedback or warm_start");
  // Both off: start at iteration 0 or 1 is allowed, as in PyTorch.
  EXPECT_EQ(error(ddp::PowerSGDState().start_powerSGD_iter(0).warm_start(false).use_error_feedback(
                false)),
            "<no exception>");
  EXPECT_ERROR_HAS(error(ddp::PowerSGDState().random_seed(uint64_t(1) << 32)),
                   "random_seed must be in 0..2^32-1");
  EXPECT_ERROR_HAS(error(ddp::PowerSGDState().min_compression_rate(0)),
                   "min_compression_rate must be positive");
  EXPECT_ERROR_HAS(ddp_test::error_of([] { ddp::powersgd_hook(nullptr); }), "the state is null");
}

// With a rank as large as each matrix's smaller side, P Qᵀ is M itself (Q orthonormal,
// P = M Q, M Q Qᵀ = M), so PowerSGD must train as plain averaging does, up to rounding.
TEST(PowerSGDTest, FullRankEqualsPlainAveraging) {
  PsgdRun run;
  run.world = 3;
  run.rank = 64;
  run.min_compression_rate = 1e-3;  // compress every matrix even so
  run.steps = 12;
  const Data d = make_data(run.world, run.steps);
  std::vector<int64_t> stats;
  const at::Tensor compressed = train(run, d.init, d.x, d.y, /*powersgd=*/true, &stats);
  const at::Tensor plain = train(run, d.init, d.x, d.y, /*powersgd=*/false);
  const double diff = (compressed - plain).abs().max().item<double>();
  EXPECT_LT(diff, 1e-4) << "full-rank PowerSGD against plain averaging";
  EXPECT_GT((plain - d.init).abs().max().item<double>(), 1e-2);
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_EQ(stats[0], run.steps);
  EXPECT_GT(stats[1], 0);  // compression ran
}

// Low rank loses something: the parameters differ from plain averaging (the comparison
// above could not fail if the hook did nothing), and the statistics count the bytes.
TEST(PowerSGDTest, LowRankCompressesAndCounts) {
  PsgdRun run;
  run.steps = 6;
  const Data d = make_data(run.world, run.steps);
  std::vector<int64_t> stats;
  const at::Tensor compressed = train(run, d.init, d.x, d.y, true, &stats);
  const at::Tensor plain = train(run, d.init, d.x, d.y, false);
  EXPECT_GT((compressed - plain).abs().max().item<double>(), 1e-5);
  // Compressed iterations 2..5: the three weights at rank 1, (n + m) each, and the
  // biases (64 + 64 + 8) uncompressed; before: every element.
  const int64_t iters = run.steps - run.start;
  EXPECT_EQ(stats[1], iters * (32 * 64 + 64 + 64 * 64 + 64 + 64 * 8 + 8));
  EXPECT_EQ(stats[2], iters * ((64 + 32) + 64 + (64 + 64) + 64 + (8 + 64) + 8));
}

// Trains the MLP at 2 ranks from `from` to `to` under a new DDP with `state`.
void continue_training(ddp::ProcessGroup& pg, torch::nn::Sequential& model,
                       const std::shared_ptr<ddp::PowerSGDState>& state, const Data& d, int from,
                       int to) {
  auto dmodel = ddp::DistributedDataParallel(model, ddp_test::options_for(pg));
  dmodel->register_comm_hook(ddp::powersgd_hook(state));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
  const int r = pg.rank();
  for (int s = from; s < to; ++s) {
    opt.zero_grad();
    auto xs = d.x[s].slice(0, r * kPerRank, (r + 1) * kPerRank);
    auto ys = d.y[s].slice(0, r * kPerRank, (r + 1) * kPerRank);
    ddp_test::mse(dmodel(xs), ys).backward();
    opt.step();
  }
}

std::shared_ptr<ddp::PowerSGDState> make_state(bool warm_start, bool error_feedback) {
  return std::make_shared<ddp::PowerSGDState>(ddp::PowerSGDState()
                                                  .matrix_approximation_rank(2)
                                                  .start_powerSGD_iter(2)
                                                  .use_error_feedback(error_feedback)
                                                  .warm_start(warm_start));
}

// IterationStats::bytes_sent: the whole buffer before start_powerSGD_iter, then the
// uncompressed tensors and the factors: (n + m) r per matrix, in float32.
TEST(PowerSGDTest, IterationStatsCountTheBytesSent) {
  const int world = 2, steps = 3;
  const Data d = make_data(world, steps);
  std::vector<int64_t> sent;
  ddp_test::run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    auto model = make_mlp();
    load_flat(*model, d.init);
    auto dmodel = ddp::DistributedDataParallel(model, ddp_test::options_for(pg));
    dmodel->register_comm_hook(ddp::powersgd_hook(make_state(true, true)));
    const int r = pg.rank();
    for (int s = 0; s < steps; ++s) {
      auto xs = d.x[s].slice(0, r * kPerRank, (r + 1) * kPerRank);
      auto ys = d.y[s].slice(0, r * kPerRank, (r + 1) * kPerRank);
      ddp_test::mse(dmodel(xs), ys).backward();
      if (r == 0) sent.push_back(dmodel->last_iteration_stats().bytes_sent);
    }
  });
  const int64_t full = 32 * 64 + 64 + 64 * 64 + 64 + 64 * 8 + 8;
  const int64_t rank2 = (64 + 32) * 2 + 64 + (64 + 64) * 2 + 64 + (8 + 64) * 2 + 8;
  EXPECT_EQ(sent, (std::vector<int64_t>{4 * full, 4 * full, 4 * rank2}));
}

// A job stopped after k steps and resumed from state_dict() and the weights, under a new
// DDP (which starts from its initial bucket layout again), ends bit for bit where the
// uninterrupted job ends: Note [PowerSGD's state per parameter].
TEST(PowerSGDTest, ResumesFromStateDictBitIdentically) {
  const int world = 2, steps = 10, cut = 5;
  const Data d = make_data(world, steps);
  for (bool error_feedback : {true, false}) {
    at::Tensor straight, resumed;
    ddp_test::run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
      auto a = make_mlp();
      load_flat(*a, d.init);
      continue_training(pg, a, make_state(true, error_feedback), d, 0, steps);

      auto b = make_mlp();
      load_flat(*b, d.init);
      auto first = make_state(true, error_feedback);
      continue_training(pg, b, first, d, 0, cut);
      const auto saved = first->state_dict(*b);
      auto c = make_mlp();  // the resumed process: a new model, state and DDP
      load_flat(*c, flat(*b));
      auto second = make_state(true, error_feedback);
      second->load_state_dict(saved, *c);
      EXPECT_EQ(second->iter(), cut);
      continue_training(pg, c, second, d, cut, steps);
      if (pg.rank() == 0) {
        straight = flat(*a).clone();
        resumed = flat(*c).clone();
      }
    });
    EXPECT_TRUE(at::equal(straight, resumed))
        << "error feedback " << error_feedback << ": differs by "
        << (straight - resumed).abs().max().item<double>();
    EXPECT_GT((straight - d.init).abs().max().item<double>(), 1e-2);
  }
}

// Without warm start every iteration draws new random Qs in bucket order; state_dict()
// still carries everything: a reloaded state continues as the state itself does.
TEST(PowerSGDTest, StateDictRoundTripsWithoutWarmStart) {
  const int world = 2, steps = 10, cut = 5;
  const Data d = make_data(world, steps);
  at::Tensor kept, reloaded;
  ddp_test::run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    auto a = make_mlp();
    load_flat(*a, d.init);
    auto state = make_state(false, true);
    continue_training(pg, a, state, d, 0, cut);
    auto b = make_mlp();
    load_flat(*b, flat(*a));
    auto fresh = make_state(false, true);
    fresh->load_state_dict(state->state_dict(*a), *b);
    continue_training(pg, a, state, d, cut, steps);
    continue_training(pg, b, fresh, d, cut, steps);
    if (pg.rank() == 0) {
      kept = flat(*a).clone();
      reloaded = flat(*b).clone();
    }
  });
  EXPECT_TRUE(at::equal(kept, reloaded)) << (kept - reloaded).abs().max().item<double>();
}

// The same through ddp::save_checkpoint / load_checkpoint (Checkpoint::powersgd), with
// each rank's error in the file; and a load by another number of ranks is refused.
TEST(PowerSGDTest, ResumesFromACheckpointBitIdentically) {
  const int world = 2, steps = 10, cut = 5;
  const Data d = make_data(world, steps);
  ddp_test::TempDir dir;
  const std::string path = dir.file("ckpt.pt");
  at::Tensor straight, resumed;
  ddp_test::run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    auto a = make_mlp();
    load_flat(*a, d.init);
    continue_training(pg, a, make_state(true, true), d, 0, steps);

    auto b = make_mlp();
    load_flat(*b, d.init);
    auto first = make_state(true, true);
    continue_training(pg, b, first, d, 0, cut);
    ddp::save_checkpoint(path, ddp::Checkpoint(*b)
                                   .powersgd(first.get())
                                   .rng(false)
                                   .step(cut)
                                   .process_group(ddp_test::borrow(pg)));
    auto c = make_mlp();
    auto second = make_state(true, true);
    ddp::Checkpoint ckpt(*c);
    ckpt.powersgd(second.get()).rng(false).process_group(ddp_test::borrow(pg));
    ddp::load_checkpoint(path, ckpt);
    EXPECT_EQ(second->iter(), cut);
    continue_training(pg, c, second, d, cut, steps);
    if (pg.rank() == 0) {
      straight = flat(*a).clone();
      resumed = flat(*c).clone();
    }
  });
  EXPECT_TRUE(at::equal(straight, resumed)) << (straight - resumed).abs().max().item<double>();
  // One process cannot take two ranks' error feedback.
  auto lone = make_mlp();
  auto state = make_state(true, true);
  ddp::Checkpoint ckpt(*lone);
  ckpt.powersgd(state.get()).rng(false);
  EXPECT_ERROR_HAS(ddp_test::error_of([&] { ddp::load_checkpoint(path, ckpt); }),
                   "the PowerSGD state was saved by 2 ranks and is loaded by 1");
  EXPECT_EQ(state->iter(), 0);  // nothing changed
}

TEST(PowerSGDTest, LoadStateDictRefusesAnotherModelOrRank) {
  ddp::PowerSGDState state = ddp::PowerSGDState().matrix_approximation_rank(2);
  auto model = make_mlp();
  auto saved = state.state_dict(*model);
  saved.insert("q.0.weight", at::zeros({32, 3}));  // rank 3's shape
  EXPECT_ERROR_HAS(ddp_test::error_of([&] { state.load_state_dict(saved, *model); }),
                   "expected [32, 2] for matrix_approximation_rank 2");
  auto other = state.state_dict(*model);
  other.insert("error.9.weight", at::zeros({4}));
  EXPECT_ERROR_HAS(ddp_test::error_of([&] { state.load_state_dict(other, *model); }),
                   "names a parameter '9.weight' that the model lacks");
  auto partial = state.state_dict(*model);
  ASSERT_EQ(partial.erase("rng"), 1u);
  EXPECT_ERROR_HAS(ddp_test::error_of([&] { state.load_state_dict(partial, *model); }), "no 'rng'");
}

// Seven runs against PyTorch. Python's start-up (torch's import) is most of a run, so
// one Python process trains all seven (powersgd_peer.py takes them in a row), each
// in a folder of its own, before the first case; each case then trains its run here
// and compares.
const std::vector<PsgdRun> kPythonRuns = {PsgdRun{2, 1, true, false},  PsgdRun{2, 4, true, false},
                                          PsgdRun{2, 1, false, false}, PsgdRun{2, 4, false, false},
                                          PsgdRun{3, 1, true, false},  PsgdRun{3, 4, false, false},
                                          PsgdRun{2, 4, true, true}};

std::string run_name(const PsgdRun& r) {
  return "world" + std::to_string(r.world) + "_rank" + std::to_string(r.rank) +
         (r.ef_warm ? "_ef_warm" : "_plain") + (r.bucket_view ? "_bucket_view" : "");
}

class PowerSGDPythonTest : public ::testing::TestWithParam<PsgdRun> {
 protected:
  static void SetUpTestSuite() {
    run_ = std::make_unique<ddp_test::SuiteRun>();
    std::string args;
    for (const PsgdRun& run : kPythonRuns) {
      const std::string d = run_->dir.file(run_name(run));
      ASSERT_EQ(::mkdir(d.c_str(), 0700), 0) << d;
      const Data data = make_data(run.world, run.steps);
      ddp_test::write_floats(d + "/init.bin", data.init);
      ddp_test::write_floats(d + "/x.bin", data.x);
      ddp_test::write_floats(d + "/y.bin", data.y);
      args += " " + d + " " + std::to_string(run.world) + " " + std::to_string(run.rank) + " " +
              std::to_string(int(run.ef_warm)) + " " + std::to_string(int(run.bucket_view)) + " " +
              std::to_string(run.steps);
    }
    run_->rc = ddp_test::run_command(std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                                         "/tests/parallel/python/powersgd_peer.py" + args + " 2>&1",
                                     &run_->output);
  }
  static void TearDownTestSuite() { run_.reset(); }
  static std::unique_ptr<ddp_test::SuiteRun> run_;
};
std::unique_ptr<ddp_test::SuiteRun> PowerSGDPythonTest::run_;

TEST_P(PowerSGDPythonTest, MatchesTorchPowerSGDHook) {
  const PsgdRun run = GetParam();
  if (run_->rc == 3) GTEST_SKIP() << run_->output;
  ASSERT_EQ(run_->rc, 0) << run_->output;
  const Data d = make_data(run.world, run.steps);
  const std::string dir = run_->dir.file(run_name(run));
  const at::Tensor py = ddp_test::read_floats(dir + "/py.bin", {d.init.numel()});
  std::vector<int64_t> stats;
  const at::Tensor cpp = train(run, d.init, d.x, d.y, true, &stats);
  const double diff = (cpp - py).abs().max().item<double>();
  std::printf("world %d, rank %lld, error feedback and warm start %s%s: max difference %.3g\n",
              run.world, static_cast<long long>(run.rank), run.ef_warm ? "on" : "off",
              run.bucket_view ? ", gradient_as_bucket_view" : "", diff);
  // Two ranks sum exactly in any order: bit for bit. Three: the sum's order is each
  // backend's own (Gloo's ring, or ddp-cpp's shared memory), so within rounding.
  if (run.world == 2) {
    EXPECT_EQ(diff, 0.0);
  } else {
    EXPECT_LT(diff, 1e-6);
  }
  EXPECT_GT((py - d.init).abs().max().item<double>(), 1e-2);
  std::ifstream f(dir + "/py_stats.txt");
  int64_t iter = 0, before = 0, after = 0;
  f >> iter >> before >> after;
  EXPECT_EQ(stats, (std::vector<int64_t>{iter, before, after}));
}

INSTANTIATE_TEST_SUITE_P(Cases, PowerSGDPythonTest, ::testing::ValuesIn(kPythonRuns),
                         [](const ::testing::TestParamInfo<PsgdRun>& info) {
                           return run_name(info.param);
                         });

}  // namespace powersgd_test
