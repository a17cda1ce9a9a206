#pragma once

// Checkpoints: everything a training run needs to continue bit-identically after it was
// stopped or killed (model, optimizer state, epoch and step, sampler position, RNG
// states), in a file that Python's torch.load reads as a plain dict.
//
// Example (every rank runs this):
//   ddp::CheckpointOptions where("runs/ckpt");                   // keeps the last 3
//   ddp::Checkpoint ckpt(*model);        // the unwrapped module: ddp_model->module()
//   ckpt.optimizer(&optimizer).sampler(&sampler);
//   if (ddp::load_latest_checkpoint(where, ckpt)) start_epoch = ckpt.epoch();
//   for (int64_t epoch = start_epoch; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);        // keeps a restored mid-epoch position
//     for (auto& batch : *loader) {
//       ...; optimizer.step(); ++step;
//       if (step % 100 == 0) ddp::save_checkpoint(where, ckpt.epoch(epoch).step(step));
//     }
//   }
//
// File layout (a dict; torch.load(path) in Python returns it):
//   "format": "ddp-cpp checkpoint", "version": 1, "epoch", "step", "world_size"
//   "model":     state dict, keys and order as Python's module.state_dict(); for a model
//                under ddp::fully_shard the full parameters (gathered from the shards;
//                loading cuts each rank's rows out again, at any world size)
//   "optimizer": Python's optimizer.state_dict() layout ("state" keyed by parameter
//                index, "param_groups" with hyperparameters and "params"), plus "type"
//                and "param_names" (index -> model key); SGD, Adam and AdamW
//   "sampler":   epoch, dataset_size, num_replicas, shuffle, seed, drop_last, and
//                "positions" (indices handed out, per rank)
//   "rng":       per rank, {"cpu": torch.get_rng_state(), "cuda": [per-device states]}
//   "scaler":    GradScaler.state_dict() (Python's keys), when a grad scaler is set
//   "powersgd":  per rank, PowerSGDState::state_dict(model), when a PowerSGD state is set
//   "extra":     the caller's own values

#include <ddp/distributed/process_group.h>
#include <ddp/data/distributed_sampler.h>

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <torch/arg.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace ddp {

namespace amp {
class GradScaler;
}  // namespace amp

class ZeroRedundancyOptimizer;
class PowerSGDState;
namespace detail {
class ShardedOptimizerState;
}  // namespace detail

/// The caller's own values in a checkpoint: string keys, any IValue (int, double,
/// string, tensor, list, dict); Python reads it as dict[str, Any].
using CheckpointExtra = c10::impl::GenericDict;

/// What a checkpoint saves and restores. The model is required; the optimizer, sampler
/// and grad scaler are optional (nullptr: neither saved nor restored). Holds pointers, not
/// copies: they must outlive the save/load calls. load_checkpoint fills epoch, step
/// and extra.
///
/// Example:
///   ddp::Checkpoint(*model).optimizer(&optimizer).sampler(&sampler).epoch(1).step(250);
struct Checkpoint {
  explicit Checkpoint(torch::nn::Module& model) : model_(&model) {}

  /// The unwrapped model (for DDP: ddp_model->module()); its parameters and buffers.
  Checkpoint& model(torch::nn::Module& model) {
    model_ = &model;
    return *this;
  }
  torch::nn::Module* model() const { return model_; }
  /// torch::optim::SGD, Adam or AdamW; nullptr: none.
  Checkpoint& optimizer(torch::optim::Optimizer* optimizer) {
    optimizer_ = optimizer;
    sharded_optimizer_.reset();
    return *this;
  }
  Checkpoint& optimizer(std::nullptr_t) {
    return optimizer(static_cast<torch::optim::Optimizer*>(nullptr));
  }
  /// A ZeroRedundancyOptimizer over SGD, Adam or AdamW, saved as the unsharded
  /// optimizer's state (gathered on rank 0, so a plain optimizer resumes from it) and
  /// loaded into each rank's shard, with any number of ranks. Its group must be the
  /// checkpoint's. Defined with the optimizer (ddp_optim).
  Checkpoint& optimizer(ZeroRedundancyOptimizer* optimizer);
  torch::optim::Optimizer* optimizer() const { return optimizer_; }
  /// nullptr: none.
  Checkpoint& sampler(DistributedSampler* sampler) {
    sampler_ = sampler;
    return *this;
  }
  DistributedSampler* sampler() const { return sampler_; }
  /// The mixed-precision loss scaler (its scale and growth tracker); nullptr: none. A
  /// checkpoint without scaler state (saved without one, or by a disabled scaler) loads
  /// and leaves the scaler as it is, so mixed precision can be switched on when resuming.
  Checkpoint& grad_scaler(amp::GradScaler* scaler) {
    grad_scaler_ = scaler;
    return *this;
  }
  amp::GradScaler* grad_scaler() const { return grad_scaler_; }
  /// The state of a PowerSGD comm hook (ddp::powersgd_hook): iter, its generator and,
  /// per parameter, each rank's error feedback and the warm-started Q, saved per rank,
  /// so that a resumed run compresses bit-identically. nullptr: none. Loading needs the
  /// world size it was saved with (the error is each rank's own).
  Checkpoint& powersgd(PowerSGDState* state) {
    powersgd_ = state;
    return *this;
  }
  PowerSGDState* powersgd() const { return powersgd_; }
  /// The group to synchronise with (as DistributedDataParallelOptions::process_group);
  /// nullptr: the default group if initialised, else this process alone.
  Checkpoint& process_group(std::shared_ptr<ProcessGroup> group) {
    process_group_ = std::move(group);
    return *this;
  }
  const std::shared_ptr<ProcessGroup>& process_group() const { return process_group_; }
  /// Set by optimizer(ZeroRedundancyOptimizer*) (Note [Sharded optimizers in checkpoints]).
  const std::shared_ptr<detail::ShardedOptimizerState>& sharded_optimizer() const {
    return sharded_optimizer_;
  }

  /// The epoch in progress.
  TORCH_ARG(int64_t, epoch) = 0;
  /// Optimizer steps taken so far; names the file in a checkpoint directory.
  TORCH_ARG(int64_t, step) = 0;
  /// Save and restore every rank's RNG states (torch's default CPU generator and, where
  /// present, each CUDA device's), so that dropout and random augmentation repeat.
  TORCH_ARG(bool, rng) = true;
  /// The caller's own values. A dict shares its contents when copied.
  TORCH_ARG(CheckpointExtra, extra) = CheckpointExtra(c10::StringType::get(), c10::AnyType::get());

 private:
  torch::nn::Module* model_ = nullptr;
  torch::optim::Optimizer* optimizer_ = nullptr;
  DistributedSampler* sampler_ = nullptr;
  amp::GradScaler* grad_scaler_ = nullptr;
  PowerSGDState* powersgd_ = nullptr;
  std::shared_ptr<ProcessGroup> process_group_;
  std::shared_ptr<detail::ShardedOptimizerState> sharded_optimizer_;
};

/// Saves `checkpoint` to `path`. Collective: every rank of the group calls it. Rank 0
/// writes (the model, optimizer and epoch/step are rank 0's; sampler positions and RNG
/// states are gathered from every rank); the others wait until the file is complete,
/// so nobody can read a half-written file. The write is atomic: a crash at any moment
/// leaves the previous file at `path` or the new one. If rank 0 fails to write, every
/// rank throws its error.
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);

/// Restores `checkpoint` from `path` on this rank: a file written by save_checkpoint, or
/// a folder written by save_sharded_checkpoint (as load_sharded_checkpoint). Tensors go to
/// the device of the parameter they belong to. Everything is validated before anything is changed; a
/// missing or unexpected key, a shape mismatch, a truncated or corrupt file, another
/// optimizer type, or a mid-epoch sampler position saved by another number of ranks
/// throws an error naming the key or shape, leaving model, optimizer, sampler, grad scaler
/// and RNG untouched. Not collective.
void load_checkpoint(const std::string& path, Checkpoint& checkpoint);

/// How save_checkpoint(options, ...) writes a checkpoint.
enum class CheckpointFormat {
  /// One file, <prefix>-<step>.pt, written by rank 0 (a fully_shard model's state and a
  /// ZeroRedundancyOptimizer's gathered there); Python's torch.load reads it as a dict.
  kFile,
  /// A folder, <prefix>-<step>/, in PyTorch's Distributed Checkpoint format (DCP): every
  /// rank writes the state it holds, nothing is gathered, and Python's dcp.load reads the
  /// model and optimizer. For models whose full state does not fit one rank.
  kDcp,
};

/// A directory of checkpoints named <prefix>-<step>.pt (or folders <prefix>-<step>/ with
/// CheckpointFormat::kDcp) with a `latest` pointer.
///
/// Example:
///   ddp::CheckpointOptions("runs/ckpt").keep_last(5);
///   ddp::CheckpointOptions("runs/ckpt").format(ddp::CheckpointFormat::kDcp);  // sharded
struct CheckpointOptions {
  explicit CheckpointOptions(std::string directory) : directory_(std::move(directory)) {}
  /// Created (with parents) by the first save.
  TORCH_ARG(std::string, directory);
  /// How many checkpoints to keep; older ones are deleted after a newer one is
  /// complete. 0 keeps all.
  TORCH_ARG(int64_t, keep_last) = 3;
  /// File names are <prefix>-<step>.pt, folder names <prefix>-<step>.
  TORCH_ARG(std::string, prefix) = "ckpt";
  /// What save_checkpoint writes. Loading reads either, whatever this says.
  TORCH_ARG(CheckpointFormat, format) = CheckpointFormat::kFile;
};

/// Saves to <directory>/<prefix>-<checkpoint.step()>.pt (kDcp: the folder
/// <directory>/<prefix>-<step>, as save_sharded_checkpoint), then atomically points
/// <directory>/latest at it, then deletes the oldest beyond keep_last (and folders whose
/// save did not finish). Collective, like save_checkpoint. Returns the path written.
std::string save_checkpoint(const CheckpointOptions& options, const Checkpoint& checkpoint);

/// The newest complete checkpoint, file or folder: the one `latest` names, else (no
/// pointer, or it names a missing or unfinished one) the highest step among
/// <prefix>-<step>.pt and <prefix>-<step>/; nullopt if none. Reads this rank's view of the
/// directory; not collective.
std::optional<std::string> latest_checkpoint(const CheckpointOptions& options);

/// Loads latest_checkpoint(options) if there is one and returns its path; nullopt (and
/// nothing restored) when the directory holds none. Collective: rank 0 chooses the
/// checkpoint and every rank loads that one.
std::optional<std::string> load_latest_checkpoint(const CheckpointOptions& options,
                                                  Checkpoint& checkpoint);

// ---- Sharded checkpoints: a DCP folder, nothing gathered ----------------------------

/// Saves `checkpoint` into the folder `dir` in PyTorch's Distributed Checkpoint format
/// (docs/checkpoints.md), nothing gathered: each rank writes the model and optimizer state
/// it holds (under ddp::fully_shard, its rows; a ZeroRedundancyOptimizer's state by the
/// rank that steps it) to __<rank>_0.distcp, and rank 0 writes the rest (epoch, step,
/// every rank's sampler position and RNG states, the grad scaler, extra) and, last,
/// `.metadata`. Keys: "model.<name>", "optimizer.state.<name>.<...>",
/// "optimizer.param_groups.<i>.<...>", and the file's other keys. Python reads the model
/// and optimizer with dcp.load, or the whole folder with dcp_to_torch_save. Collective.
///
/// Example: ddp::save_sharded_checkpoint("runs/step-1000", ddp::Checkpoint(*model)
///              .optimizer(&optimizer).sampler(&sampler).step(1000));
void save_sharded_checkpoint(const std::string& dir, const Checkpoint& checkpoint);

/// Loads a folder written by save_sharded_checkpoint (or save_checkpoint with kDcp) at any
/// world size and with any fully_shard units over the same parameters (or none): each
/// rank reads the saved rows that meet its own. Folders of the first sharded format
/// (shard-<r>-of-<N>.pt files and `complete`) are still read. Validated before anything
/// changes, as load_checkpoint. Not collective.
void load_sharded_checkpoint(const std::string& dir, Checkpoint& checkpoint);

// ---- State dicts, interchangeable with Python's ----------------------------------

/// The model's parameters and buffers, keyed and ordered as Python's
/// module.state_dict() for the same architecture ("conv1.weight", "bn1.running_mean").
/// The tensors are the model's own (detached), not copies.
c10::Dict<std::string, at::Tensor> model_state_dict(const torch::nn::Module& model);

/// Copies `state` into the model's parameters and buffers (converted to their device
/// and dtype). Every key and shape is checked first; on a missing or unexpected key or
/// a shape mismatch nothing is changed and the error lists them all.
void load_model_state_dict(torch::nn::Module& model,
                           const c10::Dict<std::string, at::Tensor>& state);

/// Reads a state dict from a file written by Python's torch.save(model.state_dict(),
/// path) (the zipfile format, default since PyTorch 1.6), by save_model_state_dict, or
/// the "model" entry of a checkpoint. Tensors are on the CPU.
c10::Dict<std::string, at::Tensor> read_state_dict(const std::string& path);

/// Writes model_state_dict(model) atomically, for torch.load in Python.
void save_model_state_dict(const torch::nn::Module& model, const std::string& path);

/// Writes a state dict (e.g. ddp::full_state_dict of a sharded model) atomically, for
/// torch.load(path, weights_only=True) in Python; tensors are written from the CPU.
void save_state_dict(const c10::Dict<std::string, at::Tensor>& state, const std::string& path);

}  // namespace ddp
