// GradScaler in one process: the scale/skip sequence against closed forms, the numeric
// kernels (fused and plain) against element-by-element references, Python's errors and
// state dict. tests/amp/amp_python_test.cpp compares with torch.amp.GradScaler.

#include "amp/amp_test_util.h"
#include "parallel/ddp_test_util.h"
#include "support/util.h"

#include "amp/scaler_kernels.h"

#include <ddp/amp/grad_scaler.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/optim/sgd.h>

#include <cmath>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace amp_grad_scaler_test {

using ddp::amp::GradScaler;
using ddp::amp::GradScalerOptions;
using ddp_test::error_of;
using ddp_test::kInf;
using ddp_test::kNaN;
using ddp_test::PlantedGrad;
using ddp_test::same_bits;

namespace {

constexpr double kLr = 0.125;

// Step k's chosen gradient: N(0, 1) values, with element 2 replaced where planted.
at::Tensor gradient_for(int step, float planted = 0.0f, bool plant = false) {
  at::Tensor c = ddp_test::randn({5}, 100 + step);
  if (plant) c[2] = planted;
  return c;
}

struct StepResult {
  bool stepped;
  double scale;
  int64_t tracker;
};

// One iteration: scale(loss).backward(), step, update.
StepResult run_step(GradScaler& scaler, PlantedGrad& model, torch::optim::Optimizer& opt,
                    const at::Tensor& c) {
  opt.zero_grad();
  scaler.scale(model->forward(c)).backward();
  const bool stepped = scaler.step(opt);
  scaler.update();
  return {stepped, scaler.get_scale(), scaler.state_dict().at("_growth_tracker").toInt()};
}

}  // namespace

// Defaults 2^16 / 2 / 0.5 with growth_interval 3; infs, a NaN and a -inf planted. The
// expected numbers are written out: a skip halves the scale and resets the count of good
// steps; the third good step in a row doubles it. Skipped steps leave the parameter as it
// was; taken steps apply exactly the planted gradient (unscaling by a power of two is
// exact), which an SGD step on a copy reproduces.
TEST(GradScalerTest, ScaleAndSkipSequenceFollowsTheUpdateRule) {
  PlantedGrad model(at::zeros({5}));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr));
  GradScaler scaler(GradScalerOptions().growth_interval(3));
  EXPECT_EQ(scaler.get_scale(), 65536.0);

  struct Row {
    float planted;
    bool plant;
    bool stepped;
    double scale;
    int64_t tracker;
  };
  const std::vector<Row> rows = {
      {0, false, true, 65536, 1},     {kInf, true, false, 32768, 0}, {0, false, true, 32768, 1},
      {0, false, true, 32768, 2},     {0, false, true, 65536, 0},    {kNaN, true, false, 32768, 0},
      {-kInf, true, false, 16384, 0}, {0, false, true, 16384, 1},    {0, false, true, 16384, 2},
      {0, false, true, 32768, 0},
  };
  at::Tensor expected = model->w.detach().clone();
  for (size_t k = 0; k < rows.size(); ++k) {
    const at::Tensor c = gradient_for(static_cast<int>(k), rows[k].planted, rows[k].plant);
    const StepResult got = run_step(scaler, model, opt, c);
    EXPECT_EQ(got.stepped, rows[k].stepped) << "step " << k;
    EXPECT_EQ(got.scale, rows[k].scale) << "step " << k;
    EXPECT_EQ(got.tracker, rows[k].tracker) << "step " << k;
    if (rows[k].stepped) {
      EXPECT_TRUE(same_bits(model->w.grad(), c)) << "step " << k << ": unscaled gradient";
      expected.add_(c, -kLr);
    }
    EXPECT_TRUE(same_bits(model->w.detach(), expected)) << "step " << k;
  }
}

// A gradient of 1e34 overflows float32 once scaled by more than 3.4e38 / 1e34 (~34000):
// from 2^20 the scaler skips five steps, halving each time, and steps at 2^15.
TEST(GradScalerTest, Float32OverflowBacksOffUntilTheScaledGradientFits) {
  PlantedGrad model(at::zeros({3}));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr));
  GradScaler scaler(GradScalerOptions().init_scale(1 << 20));
  const at::Tensor c = at::tensor({1e34f, 1.0f, -2.0f});
  for (int k = 0; k < 5; ++k) {
    const StepResult got = run_step(scaler, model, opt, c);
    EXPECT_FALSE(got.stepped) << "step " << k;
    EXPECT_EQ(got.scale, std::ldexp(1.0, 19 - k)) << "step " << k;
  }
  const StepResult got = run_step(scaler, model, opt, c);
  EXPECT_TRUE(got.stepped);
  EXPECT_EQ(got.scale, 32768.0);
  EXPECT_EQ(got.tracker, 1);
}

// Growth that would reach inf keeps the scale (2^127 * 2 overflows float32).
TEST(GradScalerTest, GrowthStopsBelowFloat32Infinity) {
  PlantedGrad model(at::zeros({3}));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr));
  GradScaler scaler(GradScalerOptions().init_scale(std::ldexp(1.0, 127)).growth_interval(1));
  for (int k = 0; k < 3; ++k) {
    const StepResult got = run_step(scaler, model, opt, at::full({3}, 0.25f));
    EXPECT_TRUE(got.stepped);
    EXPECT_EQ(got.scale, std::ldexp(1.0, 127));
    EXPECT_EQ(got.tracker, 0);
  }
}

// unscale_ leaves the true gradients for clipping; step() then does not unscale again.
TEST(GradScalerTest, ExplicitUnscaleThenStep) {
  PlantedGrad model(at::zeros({5}));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr));
  GradScaler scaler(GradScalerOptions().init_scale(1024));
  const at::Tensor c = gradient_for(0);
  scaler.scale(model->forward(c)).backward();
  EXPECT_TRUE(same_bits(model->w.grad(), c * 1024));
  scaler.unscale_(opt);
  EXPECT_TRUE(same_bits(model->w.grad(), c));
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_TRUE(same_bits(model->w.detach(), at::zeros({5}).add_(c, -kLr)));
  scaler.update();
}

// Two optimizers: each steps or skips on its own gradients; the scale backs off if any
// skipped (found_inf is summed over optimizers in update()).
TEST(GradScalerTest, TwoOptimizersSkipIndependentlyAndShareTheScale) {
  PlantedGrad a(at::zeros({5})), b(at::zeros({5}));
  torch::optim::SGD opt_a(a->parameters(), torch::optim::SGDOptions(kLr));
  torch::optim::SGD opt_b(b->parameters(), torch::optim::SGDOptions(kLr));
  GradScaler scaler;
  scaler.scale(a->forward(gradient_for(0)) + b->forward(gradient_for(1, kInf, true))).backward();
  EXPECT_TRUE(scaler.step(opt_a));
  EXPECT_FALSE(scaler.step(opt_b));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_TRUE(same_bits(b->w.detach(), at::zeros({5})));
  EXPECT_FALSE(same_bits(a->w.detach(), at::zeros({5})));
}

TEST(GradScalerTest, UpdateWithANewScale) {
  PlantedGrad model(at::zeros({5}));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr));
  GradScaler scaler;
  run_step(scaler, model, opt, gradient_for(0));
  scaler.update(1024.0);
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  scaler.update(at::full({1}, 512.0f));
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_TRUE(same_bits(scaler.scale(at::ones({})), at::full({}, 512.0f)));
  const std::string msg = error_of([&] { scaler.update(at::ones({1}).requires_grad_()); });
  EXPECT_ERROR_HAS(msg, "new_scale should be a one-element tensor with requires_grad=false");
}

TEST(GradScalerTest, DisabledScalerPassesThrough) {
  PlantedGrad model(at::zeros({5}));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr));
  GradScaler scaler(GradScalerOptions().enabled(false));
  const at::Tensor loss = model->forward(gradient_for(0, kInf, true));
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  scaler.unscale_(opt);
  EXPECT_TRUE(scaler.step(opt));  // steps even on an inf: no checks when disabled
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_EQ(scaler.state_dict().size(), 0u);
  scaler.load_state_dict(c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
}

// Python's messages for calls out of order.
TEST(GradScalerTest, CallsOutOfOrderAreRefusedAsInTorch) {
  PlantedGrad model(at::zeros({5}));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr));
  GradScaler scaler;
  EXPECT_ERROR_HAS(error_of([&] { scaler.step(opt); }),
                   "GradScaler::step: the scale is not initialised yet");
  EXPECT_ERROR_HAS(error_of([&] { scaler.update(); }),
                   "GradScaler::update: the scale is not initialised yet");

  scaler.scale(model->forward(gradient_for(0))).backward();
  scaler.unscale_(opt);
  EXPECT_ERROR_HAS(error_of([&] { scaler.unscale_(opt); }),
                   "unscale_() has already been called on this optimizer since the last "
                   "update().");
  scaler.step(opt);
  EXPECT_ERROR_HAS(error_of([&] { scaler.unscale_(opt); }),
                   "unscale_() is being called after step().");
  EXPECT_ERROR_HAS(error_of([&] { scaler.step(opt); }),
                   "step() has already been called since the last update().");
  scaler.update();
  // The next iteration starts afresh.
  opt.zero_grad();
  scaler.scale(model->forward(gradient_for(1))).backward();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
}

// An optimizer whose parameters have no gradient has nothing to check; as in Python,
// step() and then update() refuse.
TEST(GradScalerTest, NoGradientsMeansNoInfChecks) {
  PlantedGrad model(at::zeros({5}));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr));
  GradScaler scaler;
  scaler.scale(model->forward(gradient_for(0)));  // no backward
  EXPECT_ERROR_HAS(error_of([&] { scaler.step(opt); }),
                   "No inf checks were recorded for this optimizer");
  EXPECT_ERROR_HAS(error_of([&] { scaler.update(); }),
                   "No inf checks were recorded prior to update()");
}

TEST(GradScalerTest, Float16GradientsAreRefused) {
  PlantedGrad model(at::zeros({5}, at::kHalf));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr));
  GradScaler scaler;
  model->w.mutable_grad() = at::ones({5}, at::kHalf);
  scaler.scale(at::ones({}));
  const std::string msg = error_of([&] { scaler.step(opt); });
  EXPECT_ERROR_HAS(msg, "Attempting to unscale FP16 gradients: parameter 0 of param group 0");
  EXPECT_ERROR_HAS(msg, "Keep the parameters in float32");
}

TEST(GradScalerTest, OptionsAreValidated) {
  EXPECT_ERROR_HAS(error_of([] { GradScaler(GradScalerOptions().growth_factor(1.0)); }),
                   "GradScaler: growth_factor must be > 1.0, but got 1");
  EXPECT_ERROR_HAS(error_of([] { GradScaler(GradScalerOptions().backoff_factor(1.0)); }),
                   "GradScaler: backoff_factor must be in (0, 1), but got 1");
  EXPECT_ERROR_HAS(error_of([] { GradScaler(GradScalerOptions().growth_interval(0)); }),
                   "GradScaler: growth_interval must be >= 1, but got 0");
  EXPECT_ERROR_HAS(error_of([] { GradScaler(GradScalerOptions().init_scale(-1)); }),
                   "GradScaler: init_scale must be a finite number > 0, but got -1");
  GradScaler scaler;
  EXPECT_ERROR_HAS(error_of([&] { scaler.set_growth_factor(0.5); }),
                   "GradScaler::set_growth_factor: growth_factor must be > 1.0, but got 0.5");
  EXPECT_EQ(scaler.get_growth_factor(), 2.0);
  // A disabled scaler ignores its numbers, as in Python.
  GradScaler(GradScalerOptions().enabled(false).growth_factor(0.5));
}

// Python's keys and order; a scaler loaded from it continues the same sequence, whether
// it loads before its first scale() or after.
TEST(GradScalerTest, StateDictHasTorchsKeysAndRestoresTheSequence) {
  PlantedGrad model(at::zeros({5}));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr));
  GradScaler scaler(GradScalerOptions().growth_interval(4).backoff_factor(0.25));
  for (int k = 0; k < 4; ++k) run_step(scaler, model, opt, gradient_for(k, kInf, k == 1));
  const c10::impl::GenericDict state = scaler.state_dict();
  std::vector<std::string> keys;
  for (const auto& entry : state) keys.push_back(entry.key().toStringRef());
  EXPECT_EQ(keys, (std::vector<std::string>{"scale", "growth_factor", "backoff_factor",
                                            "growth_interval", "_growth_tracker"}));
  EXPECT_TRUE(state.at("scale").isDouble());
  EXPECT_EQ(state.at("scale").toDouble(), 16384.0);
  EXPECT_EQ(state.at("growth_factor").toDouble(), 2.0);
  EXPECT_EQ(state.at("backoff_factor").toDouble(), 0.25);
  EXPECT_EQ(state.at("growth_interval").toInt(), 4);
  EXPECT_EQ(state.at("_growth_tracker").toInt(), 2);

  GradScaler fresh;  // loads before its first scale()
  fresh.load_state_dict(state);
  GradScaler used;  // loads after one
  PlantedGrad other(at::zeros({5}));
  torch::optim::SGD other_opt(other->parameters(), torch::optim::SGDOptions(kLr));
  run_step(used, other, other_opt, gradient_for(0));
  used.load_state_dict(state);
  for (int k = 4; k < 9; ++k) {
    const at::Tensor c = gradient_for(k, kNaN, k == 7);
    const StepResult want = run_step(scaler, model, opt, c);
    for (GradScaler* s : {&fresh, &used}) {
      const StepResult got = run_step(*s, other, other_opt, c);
      EXPECT_EQ(got.stepped, want.stepped) << "step " << k;
      EXPECT_EQ(got.scale, want.scale) << "step " << k;
      EXPECT_EQ(got.tracker, want.tracker) << "step " << k;
    }
  }
}

TEST(GradScalerTest, BadStateDictsAreRefusedAndChangeNothing) {
  GradScaler scaler(GradScalerOptions().init_scale(8));
  EXPECT_ERROR_HAS(error_of([&] {
                     scaler.load_state_dict(
                         c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
                   }),
                   "The source state dict is empty, possibly because it was saved from a "
                   "disabled instance of GradScaler.");
  c10::impl::GenericDict state = GradScaler(GradScalerOptions().init_scale(4)).state_dict();
  ASSERT_EQ(state.erase("_growth_tracker"), 1u);
  EXPECT_ERROR_HAS(error_of([&] { scaler.load_state_dict(state); }),
                   "GradScaler::load_state_dict: the GradScaler state has no key "
                   "'_growth_tracker'");
  state.insert("_growth_tracker", std::string("three"));
  EXPECT_ERROR_HAS(error_of([&] { scaler.load_state_dict(state); }),
                   "'_growth_tracker' should be an int, but it is a String");
  EXPECT_EQ(scaler.get_scale(), 8.0);
}

// ---- The numeric kernels -------------------------------------------------------------

using ddp::amp::detail::KernelPath;

// Whether this LibTorch ships ATen's CPU kernels, read from its headers (independently of
// the dispatcher query under test).
#if __has_include(<ATen/ops/_amp_update_scale_cpu_dispatch.h>)
constexpr bool kHeadersHaveCpuKernels = true;
#else
constexpr bool kHeadersHaveCpuKernels = false;
#endif

TEST(ScalerKernelsTest, FusedKernelsAreFoundWhereLibTorchHasThem) {
  EXPECT_EQ(ddp::amp::detail::has_fused_kernels(at::kCPU), kHeadersHaveCpuKernels);
}

namespace {

// Element by element, in the kernel's precision: float32 for reduced types.
at::Tensor reference_unscale(const at::Tensor& grad, float inv, bool* found) {
  at::Tensor out = grad.clone();
  const at::Tensor as_double = grad.to(at::kDouble);
  const double* v = as_double.data_ptr<double>();
  for (int64_t i = 0; i < grad.numel(); ++i) {
    if (!std::isfinite(v[i])) *found = true;
    switch (grad.scalar_type()) {
      case at::kFloat:
        out.data_ptr<float>()[i] = static_cast<float>(v[i]) * inv;
        break;
      case at::kDouble:
        out.data_ptr<double>()[i] = v[i] * static_cast<double>(inv);
        break;
      case at::kHalf:
        out.data_ptr<at::Half>()[i] = at::Half(static_cast<float>(v[i]) * inv);
        break;
      case at::kBFloat16:
        out.data_ptr<at::BFloat16>()[i] = at::BFloat16(static_cast<float>(v[i]) * inv);
        break;
      default:
        ADD_FAILURE() << "unexpected dtype";
    }
  }
  return out;
}

std::vector<KernelPath> paths_here() {
  std::vector<KernelPath> paths{KernelPath::kPlain};
  if (ddp::amp::detail::has_fused_kernels(at::kCPU)) paths.push_back(KernelPath::kAuto);
  return paths;
}

const char* path_name(KernelPath p) { return p == KernelPath::kPlain ? "plain" : "fused"; }

}  // namespace

// Random gradients of each dtype (sizes 0, 1, 37: vector body and tail), a 1/3 inv_scale
// (not a power of two, so rounding shows), with and without a planted inf or NaN.
TEST(ScalerKernelsTest, UnscaleMatchesAnElementwiseReference) {
  const float inv = static_cast<float>(1.0 / 3.0);
  for (KernelPath path : paths_here()) {
    for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
      for (float plant : {0.0f, kInf, -kInf, kNaN}) {
        std::vector<at::Tensor> grads;
        std::vector<at::Tensor> want;
        bool want_found = false;
        for (int64_t n : {0, 1, 37}) {
          at::Tensor g = (ddp_test::randn({n}, 7 + n) * 1000).to(dtype);
          if (n == 37 && plant != 0.0f) g[30] = plant;
          want.push_back(reference_unscale(g, inv, &want_found));
          grads.push_back(g);
        }
        at::Tensor found = at::zeros({}, at::kFloat);
        ddp::amp::detail::non_finite_check_and_unscale(grads, found, at::full({}, inv), path);
        const std::string what = std::string(path_name(path)) + " " + c10::toString(dtype) +
                                 " planted " + std::to_string(plant);
        EXPECT_EQ(found.item<float>(), want_found ? 1.0f : 0.0f) << what;
        for (size_t i = 0; i < grads.size(); ++i) {
          // NaN where the reference has NaN (its payload bits may differ), else the same bits.
          EXPECT_TRUE(at::equal(grads[i].isnan(), want[i].isnan())) << what << ", tensor " << i;
          EXPECT_TRUE(same_bits(grads[i].masked_fill(grads[i].isnan(), 0),
                                want[i].masked_fill(want[i].isnan(), 0)))
              << what << ", tensor " << i;
        }
      }
    }
  }
}

TEST(ScalerKernelsTest, UpdateScaleFollowsTheRule) {
  struct Case {
    float scale;
    int32_t tracker;
    float found;
    double growth, backoff;
    int64_t interval;
    float want_scale;
    int32_t want_tracker;
  };
  const std::vector<Case> cases = {
      {65536, 0, 0, 2, 0.5, 2000, 65536, 1},
      {65536, 1998, 0, 2, 0.5, 2000, 65536, 1999},
      {65536, 1999, 0, 2, 0.5, 2000, 131072, 0},
      {65536, 1999, 1, 2, 0.5, 2000, 32768, 0},
      {65536, 5, 2, 2, 0.5, 2000, 32768, 0},  // two optimizers found infs: still one backoff
      {std::ldexp(1.0f, 127), 0, 0, 2, 0.5, 1, std::ldexp(1.0f, 127), 0},
      // Not powers of two: the float32 scale times the factor, in double, rounded once.
      {1000, 2, 0, 1.5, 0.7, 3, static_cast<float>(1000 * 1.5), 0},
      {1000, 2, 1, 1.5, 0.7, 3, static_cast<float>(1000 * 0.7), 0},
      {3, 0, 1, 1.5, 0.3, 3, static_cast<float>(3 * 0.3), 0},
  };
  for (KernelPath path : paths_here()) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      at::Tensor scale = at::full({}, c.scale);
      at::Tensor tracker = at::full({}, c.tracker, at::kInt);
      ddp::amp::detail::update_scale(scale, tracker, at::full({}, c.found), c.growth, c.backoff,
                                     c.interval, path);
      EXPECT_EQ(scale.item<float>(), c.want_scale) << path_name(path) << " case " << i;
      EXPECT_EQ(tracker.item<int32_t>(), c.want_tracker) << path_name(path) << " case " << i;
    }
  }
}

}  // namespace amp_grad_scaler_test
