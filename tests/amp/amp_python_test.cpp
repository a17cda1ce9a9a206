// GradScaler against PyTorch's torch.amp.GradScaler("cpu") (DDP_TEST_PYTHON, whose torch
// is the LibTorch this build uses): the same gradient sequence, infs and NaNs planted,
// must give the same skips, scales, growth trackers and parameters, bit for bit; and
// Python's final state_dict() loads into the C++ scaler. Python's side is
// tests/amp/python/grad_scaler_reference.py.
//
// python3-torch 1.13 has no CPU GradScaler (torch.cuda.amp.GradScaler asserts CUDA
// tensors), so against it these tests skip, saying so; the pip torch build runs them.

#include "amp/amp_test_util.h"
#include "parallel/ddp_test_util.h"
#include "support/suite_run.h"

#include <ddp/amp/grad_scaler.h>

#include <nlohmann/json.hpp>
#include <torch/optim/sgd.h>

#include <cmath>
#include <fstream>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace amp_python_test {

using ddp::amp::GradScaler;
using ddp::amp::GradScalerOptions;
using ddp_test::kInf;
using ddp_test::kNaN;
using ddp_test::PlantedGrad;
using nlohmann::json;

namespace {

struct Case {
  std::string name;
  GradScalerOptions options;
  int steps;
  std::map<int, float> planted;  // step -> value put into element 1
  float magnitude = 1.0f;        // multiplies every gradient
};

json number_or_name(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return static_cast<double>(v);
}

at::Tensor gradient(const Case& c, int step) {
  at::Tensor g = ddp_test::randn({6}, 300 + step) * c.magnitude;
  const auto it = c.planted.find(step);
  if (it != c.planted.end()) g[1] = it->second;
  return g;
}

constexpr double kLr = 0.1;

at::Tensor initial_weights() { return ddp_test::randn({6}, 299); }

json spec_of(const Case& c) {
  const at::Tensor w0 = initial_weights();
  json spec;
  spec["init_scale"] = c.options.init_scale();
  spec["growth_factor"] = c.options.growth_factor();
  spec["backoff_factor"] = c.options.backoff_factor();
  spec["growth_interval"] = c.options.growth_interval();
  spec["lr"] = kLr;
  for (int64_t i = 0; i < w0.numel(); ++i) spec["w0"].push_back(w0[i].item<float>());
  for (int k = 0; k < c.steps; ++k) {
    const at::Tensor g = gradient(c, k);
    json row = json::array();
    for (int64_t i = 0; i < g.numel(); ++i) row.push_back(number_or_name(g[i].item<float>()));
    spec["steps"].push_back(row);
  }
  return spec;
}

const std::vector<Case> kCases = {
    // Defaults but a short growth interval; inf, NaN, -inf, and a gradient of 1e34
    // that overflows float32 once scaled.
    Case{"defaults",
         GradScalerOptions().growth_interval(3),
         16,
         {{1, kInf}, {5, kNaN}, {6, -kInf}, {10, 1e34f}}},
    // Neither scale nor factors powers of two: rounding of the unscaled gradient and
    // of the scale updates shows.
    Case{
        "odd_factors",
        GradScalerOptions().init_scale(1000).growth_factor(1.5).backoff_factor(0.7).growth_interval(
            2),
        14,
        {{0, kInf}, {4, kNaN}, {5, kNaN}, {9, -kInf}},
        3.7f},
    // Growth would pass float32's largest value: the scale stays.
    Case{"top_of_range",
         GradScalerOptions().init_scale(std::ldexp(1.0, 126)).growth_interval(1),
         6,
         {{3, kInf}},
         0.01f},
    // Every gradient large: the scaler backs off until it fits.
    Case{"backs_off", GradScalerOptions().init_scale(std::ldexp(1.0, 24)), 12, {{2, kNaN}}, 1e33f}};

}  // namespace

// Python runs every case in one process (its start-up, torch's import, is most of a
// case) before the first; each case then runs the C++ scaler and compares.
class GradScalerPythonTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    run_ = std::make_unique<ddp_test::SuiteRun>();
    std::string args;
    for (const Case& c : kCases) {
      const std::string spec = run_->dir.file(c.name + ".spec.json");
      std::ofstream(spec) << spec_of(c).dump();
      args += " " + spec + " " + run_->dir.file(c.name + ".out.json");
    }
    run_->rc =
        ddp_test::run_command(std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                                  "/tests/amp/python/grad_scaler_reference.py sequence" + args,
                              &run_->output);
  }
  static void TearDownTestSuite() { run_.reset(); }
  static std::unique_ptr<ddp_test::SuiteRun> run_;
};
std::unique_ptr<ddp_test::SuiteRun> GradScalerPythonTest::run_;

TEST_P(GradScalerPythonTest, SameSequenceAsTorchAmpGradScaler) {
  const Case& c = GetParam();
  const at::Tensor w0 = initial_weights();
  ASSERT_EQ(run_->rc, 0) << run_->output;
  std::ifstream in(run_->dir.file(c.name + ".out.json"));
  const json py = json::parse(in);
  if (!py["available"].get<bool>()) {
    GTEST_SKIP() << "torch " << py["torch"].get<std::string>() << " (" << DDP_TEST_PYTHON
                 << ") has no CPU GradScaler (torch.amp.GradScaler(\"cpu\") came with torch "
                    "2.3); this cross-check runs in the pip torch build";
  }

  PlantedGrad model(w0);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr));
  GradScaler scaler(c.options);
  int skipped = 0;
  for (int k = 0; k < c.steps; ++k) {
    opt.zero_grad();
    scaler.scale(model->forward(gradient(c, k))).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();
    skipped += stepped ? 0 : 1;
    const json& want = py["steps"][k];
    EXPECT_EQ(stepped, want["stepped"].get<bool>()) << "step " << k;
    EXPECT_EQ(scaler.get_scale(), want["scale"].get<double>()) << "step " << k;
    EXPECT_EQ(scaler.state_dict().at("_growth_tracker").toInt(), want["tracker"].get<int64_t>())
        << "step " << k;
  }
  EXPECT_GT(skipped, 0) << "the case should plant at least one overflow";
  const at::Tensor w = model->w.detach();
  for (int64_t i = 0; i < w.numel(); ++i) {
    EXPECT_EQ(static_cast<double>(w[i].item<float>()), py["w"][i].get<double>())
        << "w[" << i << "]";
  }

  // Python's state_dict() loads here and reads back the same.
  GradScaler loaded;
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  const json& sd = py["state_dict"];
  state.insert("scale", sd["scale"].get<double>());
  state.insert("growth_factor", sd["growth_factor"].get<double>());
  state.insert("backoff_factor", sd["backoff_factor"].get<double>());
  state.insert("growth_interval", sd["growth_interval"].get<int64_t>());
  state.insert("_growth_tracker", sd["_growth_tracker"].get<int64_t>());
  loaded.load_state_dict(state);
  const c10::impl::GenericDict mine = scaler.state_dict();
  for (const auto& entry : mine) {
    EXPECT_EQ(loaded.state_dict().at(entry.key()), entry.value()) << entry.key().toStringRef();
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GradScalerPythonTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

}  // namespace amp_python_test
