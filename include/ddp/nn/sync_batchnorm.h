#pragma once

// SyncBatchNorm: BatchNorm whose training statistics are those of the whole batch across
// the ranks of a process group, as torch.nn.SyncBatchNorm. The design (the count-weighted
// combine, the backward, the order of collectives) is explained in docs/sync_batchnorm.md.
//
// Example:
//   ddp::init_process_group();
//   auto model = std::make_shared<NetImpl>();     // BatchNorm layers in Sequential blocks
//   ddp::convert_sync_batchnorm(model);           // each BatchNorm{1,2,3}d -> SyncBatchNorm
//   auto dmodel = ddp::DistributedDataParallel(model);
//   ... dmodel(x) ... loss.backward(); optimizer.step();

#include <ddp/distributed/process_group.h>

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <type_traits>
#include <utility>

namespace torch {
namespace nn {
class BatchNorm1dImpl;
class BatchNorm2dImpl;
class BatchNorm3dImpl;
}  // namespace nn
}  // namespace torch

namespace ddp {

/// Options of ddp::SyncBatchNorm. Names and defaults follow torch.nn.SyncBatchNorm (and
/// torch::nn::BatchNormOptions); each field says what it means for a single process.
///
/// Example:
///   ddp::SyncBatchNorm bn(ddp::SyncBatchNormOptions(64).momentum(0.01).process_group(pg));
struct SyncBatchNormOptions {
  /* implicit */ SyncBatchNormOptions(int64_t num_features);

  /// C of an (N, C, ...) input. Must be > 0.
  TORCH_ARG(int64_t, num_features);
  /// Added to the variance before the square root. Must be >= 0.
  TORCH_ARG(double, eps) = 1e-5;
  /// Weight of the new batch in the running statistics; nullopt ("None" in Python) keeps
  /// a cumulative average (weight 1 / num_batches_tracked). Must be in [0, 1].
  TORCH_ARG(c10::optional<double>, momentum) = 0.1;
  /// Learnable per-channel scale (`weight`) and shift (`bias`).
  TORCH_ARG(bool, affine) = true;
  /// Keep running_mean / running_var / num_batches_tracked, used in eval mode. Without
  /// them, eval mode normalises with the local batch's own statistics.
  TORCH_ARG(bool, track_running_stats) = true;
  /// The ranks whose batches are normalised together. nullptr: the default group at the
  /// time of each forward; with no default group initialised (a single process), this is
  /// a plain BatchNorm.
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
};

class SyncBatchNormImpl;

namespace detail {
/// A SyncBatchNorm with `batchnorm`'s options and its very parameter and buffer tensors
/// (shared, not copied), and its training flag. `batchnorm` must be a
/// torch::nn::BatchNorm{1,2,3}dImpl.
std::shared_ptr<SyncBatchNormImpl> sync_batchnorm_sharing_state_of(
    const torch::nn::Module& batchnorm, std::shared_ptr<ProcessGroup> process_group);
}  // namespace detail

/// Batch normalisation over (N, C, ...) inputs (any rank >= 2) whose training statistics
/// are the mean and variance of every rank's batch together: the output, the gradients
/// and the running statistics are those of one BatchNorm over the concatenation of the
/// ranks' batches (batch sizes may differ, also 0 on some ranks). In eval mode, at world
/// size 1, or with no process group, it is exactly torch::nn::BatchNorm and communicates
/// nothing.
///
/// Every rank of the group must run the same SyncBatchNorm forwards (and backwards) in
/// the same order: each training forward runs one all-gather (the first one over a group
/// also an 8-byte channel handshake) and each backward one all-reduce on the group. Parameter and buffer names (weight, bias, running_mean,
/// running_var, num_batches_tracked) are BatchNorm's, so state dicts are interchangeable
/// with torch::nn::BatchNorm{1,2,3}d and with Python's.
///
/// As in PyTorch, weight and bias gradients are this rank's share only; wrap the model in
/// DistributedDataParallel (or all-reduce them yourself) to combine them.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(int64_t num_features)
      : SyncBatchNormImpl(SyncBatchNormOptions(num_features)) {}
  explicit SyncBatchNormImpl(SyncBatchNormOptions options);

  /// Creates the parameters and buffers; the constructor and Cloneable::clone (on the
  /// copy) call it, as in LibTorch's own modules.
  void reset() override;
  /// running_mean = 0, running_var = 1, num_batches_tracked = 0.
  void reset_running_stats();
  /// reset_running_stats(), weight = 1, bias = 0.
  void reset_parameters();

  /// Normalises `input` of shape (N, C, ...), C = num_features. Training mode with a
  /// group of more than one rank: collective over that group (see the class comment).
  at::Tensor forward(const at::Tensor& input);

  /// "ddp::SyncBatchNorm(64, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true)"
  void pretty_print(std::ostream& stream) const override;

  /// The options with which this module was constructed.
  SyncBatchNormOptions options;

  /// Per-channel scale; defined only with affine.
  at::Tensor weight;
  /// Per-channel shift; defined only with affine.
  at::Tensor bias;
  /// Defined only with track_running_stats.
  at::Tensor running_mean;
  /// Unbiased; defined only with track_running_stats.
  at::Tensor running_var;
  /// int64 scalar; defined only with track_running_stats.
  at::Tensor num_batches_tracked;

 private:
  friend std::shared_ptr<SyncBatchNormImpl> detail::sync_batchnorm_sharing_state_of(
      const torch::nn::Module& batchnorm, std::shared_ptr<ProcessGroup> process_group);

  /// Parameters and buffers to register in place of new ones (conversion).
  struct SharedState {
    at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  };
  SyncBatchNormImpl(SyncBatchNormOptions options, SharedState state);
  /// The group this forward synchronises over, or nullptr for a plain BatchNorm forward.
  std::shared_ptr<ProcessGroup> group_for_forward() const;
  /// Note [Channel handshake]: once per group, checks that every rank's num_features is
  /// the same.
  void check_channels_once(const std::shared_ptr<ProcessGroup>& group);

  std::weak_ptr<ProcessGroup> checked_group_;
  /// Set only while the converting constructor runs reset().
  std::shared_ptr<SharedState> adopted_;
};

/// A ModuleHolder over SyncBatchNormImpl: bn(x), bn->forward(x), nullptr.
TORCH_MODULE(SyncBatchNorm);

/// Replaces every torch::nn::BatchNorm{1,2,3}d in the tree under `module` with a
/// SyncBatchNorm over `process_group` (nullptr: the default group at forward time), as
/// torch.nn.SyncBatchNorm.convert_sync_batchnorm. Each SyncBatchNorm takes the
/// BatchNorm's options and training flag and shares its very parameter and buffer tensors
/// (an optimizer built before still works); it is registered under the same name, so
/// state-dict keys do not change. Layers inside torch::nn::Sequential, ModuleList and
/// ModuleDict are replaced in the container too, so the container's forward uses them.
/// Returns `module`, or the new SyncBatchNorm when `module` itself is a BatchNorm.
///
/// A BatchNorm that something outside the tree also holds, typically a typed field
/// (`torch::nn::BatchNorm2d bn;`) beside its register_module entry, cannot be converted:
/// that field would keep calling the old, unsynchronised layer. This throws (naming the
/// layer) before changing anything; declare such fields as ddp::SyncBatchNorm instead
/// (it is a plain BatchNorm until trained with a group of several ranks), or reach the
/// layers through a container. Existing SyncBatchNorm layers are left as they are.
/// Convert before wrapping the model in DistributedDataParallel, as in PyTorch.
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    std::shared_ptr<torch::nn::Module> module,
    std::shared_ptr<ProcessGroup> process_group = nullptr);

/// The same for a module holder (Net, torch::nn::Sequential, ...): converts the layers
/// under it in place and returns the holder. A BatchNorm holder cannot hold the result;
/// pass bn.ptr() to the overload above and keep what it returns.
template <typename Holder,
          typename = std::enable_if_t<torch::detail::is_module_holder<Holder>::value>>
Holder convert_sync_batchnorm(Holder holder,
                              std::shared_ptr<ProcessGroup> process_group = nullptr) {
  using Impl = typename Holder::ContainedType;
  static_assert(!std::is_same<Impl, torch::nn::BatchNorm1dImpl>::value &&
                    !std::is_same<Impl, torch::nn::BatchNorm2dImpl>::value &&
                    !std::is_same<Impl, torch::nn::BatchNorm3dImpl>::value,
                "convert_sync_batchnorm: a BatchNorm holder cannot hold a SyncBatchNorm; "
                "pass bn.ptr() and keep the returned module.");
  TORCH_CHECK(!holder.is_empty(), "convert_sync_batchnorm got an empty module holder "
                                  "(nullptr); construct the module before converting it.");
  convert_sync_batchnorm(holder.ptr(), std::move(process_group));
  return holder;
}

}  // namespace ddp
