// The RNG and autocast state that ddp::checkpoint's recompute re-enters.

#include "algorithms/checkpoint_state.h"

// Header-only: the 1.13 / 2.x autocast functions (Note [Autocast API probe]); nothing of
// ddp_amp is linked.
#include "amp/autocast_compat.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>

#include <algorithm>
#include <mutex>

namespace ddp {
namespace detail {

namespace {

at::Generator generator_of(const c10::Device& device) {
  if (device.is_cpu()) return at::detail::getDefaultCPUGenerator();
  return at::globalContext().defaultGenerator(device);
}

at::Tensor generator_state(const c10::Device& device) {
  at::Generator gen = generator_of(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(const c10::Device& device, const at::Tensor& state) {
  at::Generator gen = generator_of(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

RngState capture_rng(const std::vector<at::Tensor>& tensors) {
  RngState state;
  state.cpu = generator_state(c10::Device(c10::kCPU));
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.is_cuda()) continue;
    const c10::Device device = t.device();
    const bool seen = std::any_of(state.devices.begin(), state.devices.end(),
                                  [&](const auto& d) { return d.first == device; });
    if (!seen) state.devices.emplace_back(device, generator_state(device));
  }
  return state;
}

RngFork::RngFork(const RngState& state) {
  outer_.cpu = generator_state(c10::Device(c10::kCPU));
  for (const auto& d : state.devices)
    outer_.devices.emplace_back(d.first, generator_state(d.first));
  set_generator_state(c10::Device(c10::kCPU), state.cpu);
  for (const auto& d : state.devices) set_generator_state(d.first, d.second);
}

RngFork::~RngFork() {
  set_generator_state(c10::Device(c10::kCPU), outer_.cpu);
  for (const auto& d : outer_.devices) set_generator_state(d.first, d.second);
}

AutocastState capture_autocast() {
  using namespace ::ddp_autocast_compat;
  AutocastState s;
  s.cpu_enabled = autocast_enabled(c10::DeviceType::CPU);
  s.cpu_dtype = autocast_dtype(c10::DeviceType::CPU);
  s.cuda_enabled = autocast_enabled(c10::DeviceType::CUDA);
  s.cuda_dtype = autocast_dtype(c10::DeviceType::CUDA);
  s.cache_enabled = at::autocast::is_autocast_cache_enabled();
  return s;
}

namespace {
void apply_autocast(const AutocastState& s) {
  using namespace ::ddp_autocast_compat;
  set_autocast_dtype_for(c10::DeviceType::CPU, s.cpu_dtype);
  set_autocast_enabled_for(c10::DeviceType::CPU, s.cpu_enabled);
  set_autocast_dtype_for(c10::DeviceType::CUDA, s.cuda_dtype);
  set_autocast_enabled_for(c10::DeviceType::CUDA, s.cuda_enabled);
  at::autocast::set_autocast_cache_enabled(s.cache_enabled);
}
}  // namespace

AutocastScope::AutocastScope(const AutocastState& state) : outer_(capture_autocast()) {
  apply_autocast(state);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  apply_autocast(outer_);
}

void clear_autocast_cache_if_enabled() {
  using namespace ::ddp_autocast_compat;
  if (autocast_enabled(c10::DeviceType::CPU) || autocast_enabled(c10::DeviceType::CUDA)) {
    at::autocast::clear_cache();
  }
}

}  // namespace detail
}  // namespace ddp
