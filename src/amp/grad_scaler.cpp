// GradScaler: torch.amp.GradScaler for LibTorch, in the same order of operations.

#include <ddp/amp/grad_scaler.h>

#include "amp/scaler_kernels.h"
#include "distributed/common/check.h"
#include "amp/scaler_state.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <cmath>

namespace ddp {
namespace amp {

// Note [Found-inf across ranks]
// Every rank must skip the same steps, or the replicas diverge: a rank that steps while
// another skips leaves the parameters different from then on, and nothing in DDP brings
// them back together. Under DDP this holds without communication:
//  - after backward, every rank holds the all-reduced gradients, and they are the same
//    bits on every rank (each element is reduced once and the result is sent to all, then
//    divided by the same world size; the fp16/bf16 hooks round the same sum the same way);
//  - an inf or NaN in any rank's local gradient makes the sum inf or NaN (inf + finite =
//    inf, inf - inf = NaN, NaN + anything = NaN), and a finite sum that overflows does so
//    on every rank; so a local overflow on one rank is seen by all.
// The check in unscale_ reads those gradients, so every rank reaches the same found_inf,
// the same skip and the same new scale. The multi-rank tests plant an overflow on one
// rank before the all-reduce and compare decisions and parameters across ranks.
// Where gradients are not synchronised before step() (a sharded optimizer), each rank
// checks only its own; GradScalerOptions::process_group then all-reduces the flag with
// MAX, so every rank skips if any rank saw an inf or NaN.

namespace {

void check_options(const GradScalerOptions& o, const char* where) {
  if (!o.enabled()) return;  // as in Python: a disabled scaler's numbers are unused
  DDP_CHECK(std::isfinite(o.init_scale()) && o.init_scale() > 0, where,
            ": init_scale must be a finite number > 0, but got ", o.init_scale());
  DDP_CHECK(o.growth_factor() > 1.0, where, ": growth_factor must be > 1.0, but got ",
            o.growth_factor());
  DDP_CHECK(o.backoff_factor() > 0.0 && o.backoff_factor() < 1.0, where,
            ": backoff_factor must be in (0, 1), but got ", o.backoff_factor());
  DDP_CHECK(o.growth_interval() >= 1, where, ": growth_interval must be >= 1, but got ",
            o.growth_interval());
}

// The gradients of one device and dtype: one call of the check-and-unscale kernel.
struct GradGroup {
  c10::Device device;
  at::ScalarType dtype;
  std::vector<at::Tensor> grads;
};

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(std::move(options)) {
  check_options(options_, "GradScaler");
}

at::Tensor GradScaler::scale(const at::Tensor& outputs) {
  if (!options_.enabled()) return outputs;
  DDP_CHECK(outputs.defined(), "GradScaler::scale: got an undefined tensor");
  if (!scale_.defined()) {
    const auto on = at::TensorOptions().device(outputs.device());
    scale_ = at::full(at::IntArrayRef{}, options_.init_scale(), on.dtype(at::kFloat));
    growth_tracker_ = at::full(at::IntArrayRef{}, init_growth_tracker_, on.dtype(at::kInt));
  }
  return outputs.mul(scale_.to(outputs.device(), /*non_blocking=*/true));
}

std::vector<at::Tensor> GradScaler::scale(const std::vector<at::Tensor>& outputs) {
  std::vector<at::Tensor> out;
  out.reserve(outputs.size());
  for (const at::Tensor& t : outputs) out.push_back(scale(t));
  return out;
}

void GradScaler::check_initialised(const char* what) const {
  DDP_CHECK(scale_.defined(), "GradScaler::", what,
            ": the scale is not initialised yet. Expected scaler.scale(loss) earlier in the "
            "iteration (its first call places the scale on the loss's device).");
}

GradScaler::OptimizerState& GradScaler::state_of(const torch::optim::Optimizer& optimizer) {
  for (OptimizerState& s : per_optimizer_) {
    if (s.optimizer == &optimizer) return s;
  }
  per_optimizer_.emplace_back();
  per_optimizer_.back().optimizer = &optimizer;
  return per_optimizer_.back();
}

void GradScaler::unscale_grads(torch::optim::Optimizer& optimizer, OptimizerState& state) {
  at::NoGradGuard no_grad;
  // The reciprocal in double, rounded once: float32 division can be imprecise.
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  const at::Tensor found_inf = at::zeros(at::IntArrayRef{}, scale_.options());

  std::vector<GradGroup> groups;  // in the order first seen, as Python's dicts
  const auto& param_groups = optimizer.param_groups();
  for (size_t g = 0; g < param_groups.size(); ++g) {
    const std::vector<at::Tensor>& params = param_groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& grad = params[i].grad();
      if (!grad.defined()) continue;
      DDP_CHECK(grad.scalar_type() != at::kHalf, "Attempting to unscale FP16 gradients: parameter ",
                i, " of param group ", g,
                " has a float16 gradient. Keep the parameters in float32 and let autocast "
                "(ddp::amp::AutocastGuard) run the forward pass in float16.");
      const at::Tensor to_unscale = grad.is_sparse() ? grad._values() : grad;
      GradGroup* group = nullptr;
      for (GradGroup& candidate : groups) {
        if (candidate.device == to_unscale.device() &&
            candidate.dtype == to_unscale.scalar_type()) {
          group = &candidate;
        }
      }
      if (group == nullptr) {
        groups.push_back(GradGroup{to_unscale.device(), to_unscale.scalar_type(), {}});
        group = &groups.back();
      }
      group->grads.push_back(to_unscale);
    }
  }

  // One found_inf per device, each a copy (as Python's _MultiDeviceReplicator).
  auto& per_device = state.found_inf_per_device;
  per_device.clear();
  for (const GradGroup& group : groups) {
    at::Tensor* found = nullptr;
    for (auto& entry : per_device) {
      if (entry.first == group.device) found = &entry.second;
    }
    if (found == nullptr) {
      per_device.emplace_back(group.device, found_inf.to(group.device, /*non_blocking=*/true,
                                                         /*copy=*/true));
      found = &per_device.back().second;
    }
    detail::non_finite_check_and_unscale(group.grads, *found,
                                         inv_scale.to(group.device, /*non_blocking=*/true));
  }

  // Note [Found-inf across ranks]: only where gradients were not synchronised.
  const std::shared_ptr<ProcessGroup>& pg = options_.process_group();
  if (pg != nullptr) {
    at::Tensor combined = found_inf;  // zero: a rank without gradients still takes part
    for (const auto& entry : per_device) {
      combined = at::maximum(combined, entry.second.to(scale_.device()));
    }
    pg->all_reduce(combined, ReduceOp::MAX);
    per_device.clear();
    per_device.emplace_back(scale_.device(), combined);
  }
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return;
  check_initialised("unscale_");
  OptimizerState& state = state_of(optimizer);
  DDP_CHECK(state.stage != Stage::kUnscaled,
            "unscale_() has already been called on this optimizer since the last update().");
  DDP_CHECK(state.stage != Stage::kStepped, "unscale_() is being called after step().");
  unscale_grads(optimizer, state);
  state.stage = Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  check_initialised("step");
  OptimizerState& state = state_of(optimizer);
  DDP_CHECK(state.stage != Stage::kStepped,
            "step() has already been called since the last update().");
  if (state.stage == Stage::kReady) {
    unscale_grads(optimizer, state);
    state.stage = Stage::kUnscaled;
  }
  DDP_CHECK(!state.found_inf_per_device.empty(),
            "No inf checks were recorded for this optimizer: none of its parameters has a "
            "gradient. Expected scaler.scale(loss).backward() before scaler.step(optimizer).");
  float found = 0;
  for (const auto& entry : state.found_inf_per_device) found += entry.second.item<float>();
  const bool stepped = found == 0;
  if (stepped) optimizer.step();
  state.stage = Stage::kStepped;
  return stepped;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  check_initialised("update");
  at::Tensor combined;
  for (const OptimizerState& state : per_optimizer_) {
    for (const auto& entry : state.found_inf_per_device) {
      const at::Tensor here = entry.second.to(scale_.device(), /*non_blocking=*/true);
      combined = combined.defined() ? combined.add(here) : here;
    }
  }
  DDP_CHECK(combined.defined(),
            "No inf checks were recorded prior to update(). Expected scaler.step(optimizer) "
            "(or scaler.unscale_(optimizer)) for at least one optimizer this iteration.");
  detail::update_scale(scale_, growth_tracker_, combined, options_.growth_factor(),
                       options_.backoff_factor(), options_.growth_interval());
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled()) return;
  check_initialised("update");
  DDP_CHECK(std::isfinite(new_scale) && new_scale > 0,
            "GradScaler::update: new_scale must be a finite number > 0, but got ", new_scale);
  scale_.fill_(new_scale);
  per_optimizer_.clear();
}

void GradScaler::update(const at::Tensor& new_scale) {
  if (!options_.enabled()) return;
  check_initialised("update");
  DDP_CHECK(new_scale.defined() && new_scale.numel() == 1 && !new_scale.requires_grad(),
            "GradScaler::update: new_scale should be a one-element tensor with "
            "requires_grad=false, but got ",
            new_scale.defined()
                ? new_scale.toString() + " of " + std::to_string(new_scale.numel()) + " elements" +
                      (new_scale.requires_grad() ? " requiring grad" : "")
                : std::string("an undefined tensor"));
  scale_.copy_(new_scale.reshape({}));
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled()) return 1.0;
  return scale_.defined() ? static_cast<double>(scale_.item<float>()) : options_.init_scale();
}

void GradScaler::set_growth_factor(double growth_factor) {
  GradScalerOptions changed = options_;
  changed.growth_factor(growth_factor);
  check_options(changed, "GradScaler::set_growth_factor");
  options_ = changed;
}

void GradScaler::set_backoff_factor(double backoff_factor) {
  GradScalerOptions changed = options_;
  changed.backoff_factor(backoff_factor);
  check_options(changed, "GradScaler::set_backoff_factor");
  options_ = changed;
}

void GradScaler::set_growth_interval(int64_t growth_interval) {
  GradScalerOptions changed = options_;
  changed.growth_interval(growth_interval);
  check_options(changed, "GradScaler::set_growth_interval");
  options_ = changed;
}

c10::impl::GenericDict GradScaler::state_dict() const {
  if (!options_.enabled()) {
    return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  }
  detail::ScalerState s;
  s.scale = get_scale();
  s.growth_factor = options_.growth_factor();
  s.backoff_factor = options_.backoff_factor();
  s.growth_interval = options_.growth_interval();
  s.growth_tracker =
      growth_tracker_.defined() ? growth_tracker_.item<int32_t>() : init_growth_tracker_;
  return detail::scaler_state_dict(s);
}

void GradScaler::load_state_dict(const c10::impl::GenericDict& state) {
  if (!options_.enabled()) return;
  DDP_CHECK(state.size() > 0,
            "The source state dict is empty, possibly because it was saved from a disabled "
            "instance of GradScaler.");
  const detail::ScalerState s = detail::parse_scaler_state(state, "GradScaler::load_state_dict");
  options_.init_scale(s.scale);
  options_.growth_factor(s.growth_factor);
  options_.backoff_factor(s.backoff_factor);
  options_.growth_interval(s.growth_interval);
  init_growth_tracker_ = s.growth_tracker;
  if (scale_.defined()) scale_.fill_(s.scale);
  if (growth_tracker_.defined()) growth_tracker_.fill_(s.growth_tracker);
}

}  // namespace amp
}  // namespace ddp
