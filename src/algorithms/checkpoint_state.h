#pragma once

// What ddp::checkpoint's recompute must see as the forward saw it: the RNG state and the
// autocast state (PyTorch's checkpoint saves and re-enters both). Used only by
// activation_checkpoint.cpp.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <utility>
#include <vector>

namespace ddp {
namespace detail {

/// The state of the CPU's default generator and of the CUDA generators of some devices.
struct RngState {
  at::Tensor cpu;
  std::vector<std::pair<c10::Device, at::Tensor>> devices;
};

/// The current state of the CPU generator and of the default generators of the CUDA
/// devices that `tensors` are on (torch.utils.checkpoint's get_device_states(*args)).
RngState capture_rng(const std::vector<at::Tensor>& tensors);

/// torch.random.fork_rng: remembers the current state of the generators in `state`, sets
/// theirs to `state`'s, and puts the remembered one back at scope exit, so that what runs
/// in between draws what the forward drew and the program's streams do not advance.
class RngFork {
 public:
  explicit RngFork(const RngState& state);
  ~RngFork();
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  RngState outer_;
};

/// Autocast's thread-local state for the CPU and CUDA.
struct AutocastState {
  bool cpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  bool cuda_enabled = false;
  at::ScalarType cuda_dtype = at::kHalf;
  bool cache_enabled = true;
};

AutocastState capture_autocast();

/// Enters `state` as torch.autocast.__enter__ does (counting the nesting); at scope exit
/// restores the previous state and, leaving the outermost region, clears the cache of
/// weight casts, as __exit__ does.
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& state);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState outer_;
};

/// Note [Autocast cache in a checkpoint]: clears autocast's cache of weight casts when
/// autocast is on, so that fn casts the weights it uses itself.
void clear_autocast_cache_if_enabled();

}  // namespace detail
}  // namespace ddp
