#pragma once

// Checkpoints in PyTorch's Distributed Checkpoint format (torch.distributed.checkpoint,
// "DCP"): a folder of data files __<rank>_0.distcp and a `.metadata` written last, which
// Python's dcp.load reads into FSDP2, DDP or a single process at any world size, and
// which this reads from Python's dcp.save. docs/checkpoints.md describes the format.
//
// Example (fully_shard at any world size; every rank calls both):
//   ddp::dcp::StateDict state;
//   state.add_model(*model);                       // keys "model.<name>", as
//                                                  // dcp.save({"model": model.state_dict()})
//   state.add_optimizer(optimizer, *model);       // "optim.state.<name>.exp_avg", ...
//   state.add_object("step", int64_t{step});
//   ddp::dcp::save(state, "ckpt/step-100");        // every rank writes its own shards
//   ...
//   ddp::dcp::load(state, "ckpt/step-100");        // in place, resharded to this run
//   int64_t step = state.object("step").toInt();

#include <ddp/distributed/process_group.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/arg.h>

#include <functional>
#include <map>
#include <memory>
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
class ZeroRedundancyOptimizer;
namespace detail {
struct DcpAsyncSave;
}  // namespace detail

namespace dcp {

/// A state dict for DCP, flattened: each key names a tensor held whole, one rank's block
/// of a sharded tensor, or an object. Tensors are held by reference: load() copies into
/// them, so a model's parameters are loaded in place.
class StateDict {
 public:
  /// A tensor that every rank holds whole (a plain or DDP model's): saved once, by rank 0
  /// of the save's group; loaded whole on every rank.
  StateDict& add_tensor(const std::string& key, at::Tensor tensor);
  /// This rank's block of a tensor of `global_size`: the elements [offsets, offsets +
  /// local.sizes()) of each dimension. Every rank saves its own block.
  StateDict& add_shard(const std::string& key, at::Tensor local, std::vector<int64_t> global_size,
                       std::vector<int64_t> offsets);
  /// A value that is not a tensor (ints, strings, lists, dicts...): saved once, pickled
  /// as torch.save does; load() replaces it with the saved one.
  StateDict& add_object(const std::string& key, c10::IValue value);
  /// Every parameter and buffer of `model`, keyed "<prefix>.<name>" as in
  /// model.state_dict() under key `prefix` of the dict that Python saves (no prefix for
  /// ""). A fully_shard parameter is added as this rank's rows (with HSDP, only the
  /// first replica saves them); the others whole.
  StateDict& add_model(const torch::nn::Module& model, const std::string& prefix = "model");
  /// The state of `optimizer` (torch::optim::SGD, Adam or AdamW over `model`'s
  /// parameters) in the layout of PyTorch's get_optimizer_state_dict, under `prefix`:
  /// "optim.state.<parameter name>.<exp_avg|exp_avg_sq|step|...>" (a fully_shard
  /// parameter's as this rank's rows; step as a float32 scalar) and
  /// "optim.param_groups.<i>.<lr|betas|...|params>", with the hyperparameters that Python's
  /// optimizer of the same type has (LibTorch's, and Python's defaults for the others).
  /// A parameter without state yet gets zeros, as get_optimizer_state_dict initialises
  /// it. The values are taken now, for save(); load() restores them into `optimizer`.
  /// A ZeroRedundancyOptimizer (passed as itself or as its base) is saved under the same
  /// keys, each state tensor whole by the rank that steps it, and loads at any world size
  /// (or into a plain or sharded optimizer, and the reverse).
  StateDict& add_optimizer(torch::optim::Optimizer& optimizer, const torch::nn::Module& model,
                           const std::string& prefix = "optim");

  /// The value under `key` (after load(), the saved one). Throws if there is none.
  const c10::IValue& object(const std::string& key) const;
  /// The keys, in the order they were added.
  const std::vector<std::string>& keys() const { return order_; }
  bool contains(const std::string& key) const { return items_.count(key) > 0; }

  struct Item {
    enum Kind { kTensor, kShard, kObject } kind = kTensor;
    at::Tensor tensor;                 // kTensor, kShard (this rank's block)
    std::vector<int64_t> global_size;  // kShard
    std::vector<int64_t> offsets;      // kShard
    c10::IValue value;                 // kObject
    /// The nested keys it came from (planner_data): strings, and ints for list indices.
    std::vector<c10::IValue> path;
    /// load() leaves it as it is when the checkpoint lacks it (a hyperparameter that an
    /// older PyTorch did not have).
    bool optional = false;
    /// Whether this rank writes it (false for an HSDP replica other than the first: the
    /// first writes the same shard).
    bool save = true;
  };
  const Item& item(const std::string& key) const;
  Item& mutable_item(const std::string& key);
  /// Adds an item as it is (its path, flags and all).
  StateDict& add_item(const std::string& key, Item item) { return add(key, std::move(item)); }

 private:
  friend void load(StateDict& state, const std::string& dir);
  StateDict& add(const std::string& key, Item item);
  StateDict& add_zero_optimizer(ZeroRedundancyOptimizer& zero, const torch::nn::Module& model,
                                const std::string& prefix);
  // Restores what the staged values of its keys hold (an optimizer's state), after every
  // key was read and before anything changes: returns the change to make, or throws.
  using Restore =
      std::function<std::function<void()>(const std::map<std::string, c10::IValue>& staged,
                                          const std::string& where)>;
  std::vector<Restore> restores_;
  std::vector<std::string> order_;
  std::map<std::string, Item> items_;
};

struct SaveOptions {
  /// The ranks that save together (each writes __<its rank>_0.distcp; rank 0 writes
  /// .metadata last). nullptr: the default group if there is one, else this process
  /// alone.
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
};

/// Saves `state` to the folder `dir` (made if needed). Collective over the group. The
/// folder is a checkpoint only once `.metadata` is in it, which rank 0 writes last
/// (atomically) after every rank's data is on disk; a save that fails on any rank fails
/// on every rank and leaves no `.metadata`. Saving into a folder that holds a checkpoint
/// first removes its `.metadata`, so a crash in between leaves it refused, not mixed.
void save(const StateDict& state, const std::string& dir, const SaveOptions& options = {});

/// What async_save returns: wait() for the save, or let the next async_save wait for it.
class AsyncSaveHandle {
 public:
  AsyncSaveHandle() = default;
  /// Blocks until the save has finished; rethrows its error (every rank gets it, as from
  /// save()). Waiting again returns at once (or rethrows again).
  void wait();
  /// Whether the save has finished (without blocking).
  bool done() const;

 private:
  friend AsyncSaveHandle async_save(const StateDict&, const std::string&, const SaveOptions&);
  std::shared_ptr<::ddp::detail::DcpAsyncSave> state_;
};

/// torch.distributed.checkpoint.async_save: copies every tensor of `state` to host memory
/// now, so that training may change the model at once, and writes the checkpoint in a
/// background thread, as save() does (Note [DCP async save]). Collective over the group,
/// at the call. This process's previous async_save is waited for first (and its error
/// rethrown here), so at most one is in flight. Its exchanges run on a group of their
/// own, made from the save's group at the first call, so they never interleave with the
/// training's collectives. A crash while it writes leaves the folder without `.metadata`:
/// refused as unfinished, and every earlier checkpoint whole.
AsyncSaveHandle async_save(const StateDict& state, const std::string& dir,
                           const SaveOptions& options = {});

/// Loads every key of `state` from the checkpoint in `dir`, written by save() or by
/// Python's dcp.save at any world size: each tensor gets the saved elements of its block
/// (reading only the chunks that meet it), each object the saved value. Not collective.
/// Everything is read and checked before anything changes: a missing key, another shape,
/// a damaged or unfinished checkpoint throws, naming the file and key, and leaves `state`
/// (and the model behind it) as it was.
void load(StateDict& state, const std::string& dir);

/// torch.distributed.checkpoint.format_utils.dcp_to_torch_save: the whole checkpoint as
/// one torch.save file (nested as it was saved: {"model": {...}, ...}) that Python's
/// torch.load(weights_only=True) reads. Not collective; run it on one rank.
void to_torch_save(const std::string& dir, const std::string& file);

/// The keys of the checkpoint in `dir` (its .metadata), in its order.
std::vector<std::string> checkpoint_keys(const std::string& dir);

}  // namespace dcp
}  // namespace ddp
