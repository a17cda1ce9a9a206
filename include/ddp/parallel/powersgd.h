#pragma once

// PowerSGD gradient compression (Vogels et al., 2019) as a DDP comm hook, with the
// semantics of PyTorch's torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook:
// the same state fields and defaults, the same split of each bucket into compressed
// matrices and uncompressed tensors, the same random projections for the same seed,
// error feedback and warm start. For jobs whose network costs more than their backward
// (several hosts over Gloo's TCP); docs/powersgd.md.
//
// Example (every rank):
//   auto state = std::make_shared<ddp::PowerSGDState>(
//       ddp::PowerSGDState().matrix_approximation_rank(4).start_powerSGD_iter(1000));
//   dmodel->register_comm_hook(ddp::powersgd_hook(state));
//   ...
//   ckpt.extra().insert("powersgd", state->state_dict());   // to resume bit-identically
//
// Each iteration from start_powerSGD_iter on, per bucket: the gradients (plus the error
// left by the previous compression, with error feedback) are split; 1-D tensors and
// matrices that would not shrink by min_compression_rate are all-reduced as one flat
// tensor; every other gradient, viewed as an n × m matrix M, is approximated by P Qᵀ of
// rank r = min(n, m, matrix_approximation_rank): P = M Q, all-reduce P, orthogonalise P,
// Q = Mᵀ P, all-reduce Q and divide by the world size, M ≈ P Qᵀ. Bytes sent per matrix:
// (n + m) r instead of n m. Before start_powerSGD_iter, a plain average.

#include <ddp/parallel/comm_hooks.h>

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace ddp {
namespace detail {
struct PowerSGDParamState;

/// numpy.random.RandomState(seed).randint(high) (the legacy Mersenne Twister and its
/// masked rejection sampling), the generator PyTorch's PowerSGD draws its seeds from.
class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed = 0);
  /// A value in [0, high), high in [1, 2^32].
  int64_t randint(int64_t high);
  /// The 624 state words and the position, as int64 values (for a checkpoint).
  std::vector<int64_t> state() const;
  void set_state(const std::vector<int64_t>& state);

 private:
  uint32_t next();
  uint32_t mt_[624];
  int pos_ = 624;
};
}  // namespace detail

/// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState: the
/// hyperparameters (PyTorch's names and defaults) and the state the hook keeps between
/// iterations. Share one instance between the hook and your checkpoint code.
class PowerSGDState {
 public:
  PowerSGDState() = default;
  PowerSGDState(const PowerSGDState& other);
  PowerSGDState& operator=(const PowerSGDState& other);

  /// The group to reduce over; nullptr: DDP's.
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
  /// The rank r of each approximation P Qᵀ (lower: stronger compression). 1 to 4 is
  /// typical. Must be >= 1.
  TORCH_ARG(int64_t, matrix_approximation_rank) = 1;
  /// Plain all-reduce for the iterations before this one. Must be > 1 with error
  /// feedback or warm start (DDP may rebuild its buckets after the first iteration).
  TORCH_ARG(int64_t, start_powerSGD_iter) = 1000;
  /// A matrix is compressed only if (n + m) r * min_compression_rate < n m.
  TORCH_ARG(double, min_compression_rate) = 2;
  /// Add the previous iteration's compression error to the gradients before compressing.
  TORCH_ARG(bool, use_error_feedback) = true;
  /// Start each iteration's Q from the previous one's instead of new random values.
  TORCH_ARG(bool, warm_start) = true;
  /// Added to each column's norm in the Gram-Schmidt orthogonalisation (0: none; set a
  /// small value such as 1e-8 when a whole gradient matrix can be zero).
  TORCH_ARG(double, orthogonalization_epsilon) = 0;
  /// Seeds the generator of Q's random initial values; the same on every rank.
  TORCH_ARG(uint64_t, random_seed) = 0;
  /// Compress the matrices of one shape in a bucket as one batch (fewer, larger
  /// products); the result is the same.
  TORCH_ARG(bool, batch_tensors_with_same_shape) = false;

 public:
  /// Iterations seen (PyTorch's state.iter).
  int64_t iter() const;
  /// Elements before and after compression, summed over every bucket and iteration
  /// since compression started (PyTorch's compression_stats()).
  int64_t numel_before_compression() const;
  int64_t numel_after_compression() const;
  /// numel_before / numel_after, or 0 before compression started.
  double compression_rate() const;

  /// The state a resumed run needs, as a dict of plain values (tensors on the CPU):
  /// iter, the compression counts, the generator's position, and per parameter of
  /// `model` (by its state-dict name) this rank's error and the warm-started Q. Kept per
  /// parameter, not per bucket, so that it applies whatever bucket layout DDP has when
  /// the run resumes (Note [PowerSGD's state per parameter]). The error is this rank's
  /// own: ddp::save_checkpoint keeps one entry per rank (Checkpoint::powersgd).
  c10::impl::GenericDict state_dict(const torch::nn::Module& model) const;
  /// Restores state_dict(model); the hyperparameters stay this object's. Throws on a
  /// dict that was not written by state_dict(), or names a parameter `model` lacks, or
  /// holds a tensor of the wrong size, naming the key; nothing is changed then.
  void load_state_dict(const c10::impl::GenericDict& state, const torch::nn::Module& model);

  /// Checks the hyperparameters; throws an error naming the bad one. Called by
  /// powersgd_hook.
  void validate() const;

 private:
  friend class PowerSGDHook;
  mutable std::mutex mutex_;
  int64_t iter_ = 0;
  int64_t numel_before_ = 0;
  int64_t numel_after_ = 0;
  std::optional<detail::NumpyRandomState> rng_;  // seeded from random_seed at first use
  // Keyed by the parameter's TensorImpl; holds the parameter, so the key stays valid.
  std::map<const void*, std::shared_ptr<detail::PowerSGDParamState>> params_;
};

/// The PowerSGD comm hook over `state` (PyTorch's powerSGD_hook). Register it with
/// DistributedDataParallel::register_comm_hook before the first backward. Throws on
/// invalid hyperparameters (PowerSGDState::validate).
std::shared_ptr<CommHook> powersgd_hook(std::shared_ptr<PowerSGDState> state);

}  // namespace ddp
