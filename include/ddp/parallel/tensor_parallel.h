#pragma once

// Tensor parallelism: ddp::parallelize_module, PyTorch's
// torch.distributed.tensor.parallel for LibTorch modules. A plan maps module paths (with
// `*` wildcards) to styles: ColwiseParallel shards a Linear's output features (an
// Embedding's embedding dimension), RowwiseParallel its input features (an Embedding's
// rows) and reduces the partial results, SequenceParallel runs a module (LayerNorm,
// dropout) on the rank's slice of the sequence. Design and the table against PyTorch's
// API: docs/tensor_parallel.md.
//
// Example (every rank of the mesh runs this; an MLP whose fields are declared as below):
//   auto tp = ddp::init_device_mesh("cpu", {world});
//   ddp::parallelize_module(*model, tp, {{"fc1", ddp::ColwiseParallel()},
//                                        {"fc2", ddp::RowwiseParallel()}});
//   torch::optim::AdamW opt(model->parameters());   // each rank's part of fc1 and fc2
//   auto y = model->forward(x);                      // x and y whole on every rank
//
// Note [Parallel modules take their module's place]
// A LibTorch module's forward is called through its parent's typed field or through a
// container, with no forward hooks (Note [Units take their module's place] in
// fully_shard.h). So a styled module runs inside a ddp::TensorParallelImpl<M>, whose
// forward does the style's communication around M's. parallelize_module puts one in
// place of each module the plan names where the tree holds it (the parent's registry, a
// Sequential, ModuleList or ModuleDict). A typed field (`torch::nn::Linear fc1`) cannot
// hold it: declare the field as ddp::TensorParallel<torch::nn::LinearImpl> (a plain
// pass-through until a plan names it), or reach the module through a container.
// parallelize_module refuses a plan that names a module held elsewhere, before it changes
// anything. The wrapper registers M's parameters as its own under the same names, so
// state dicts keep their keys.
//
// Parameters are plain tensors holding the rank's part (no DTensor); ddp::full_state_dict
// (fully_shard.h) gathers them. Outputs are plain tensors too (PyTorch's
// use_local_output=True); their layout is the style's output_layouts.

#include <ddp/distributed/device_mesh.h>
#include <ddp/distributed/process_group.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace ddp {

/// How a tensor lies across the ranks of the tensor-parallel group:
/// torch.distributed.tensor's Replicate() (whole on every rank) or Shard(dim) (split along
/// `dim` as torch.chunk splits it: ceil(n / ranks) each, the last ones shorter or empty).
class Placement {
 public:
  static Placement replicate() { return Placement(false, 0); }
  static Placement shard(int64_t dim) { return Placement(true, dim); }
  bool is_shard() const { return shard_; }
  bool is_replicate() const { return !shard_; }
  /// The sharded dimension (negative counts from the end).
  int64_t dim() const { return dim_; }
  std::string str() const;
  bool operator==(const Placement& other) const {
    return shard_ == other.shard_ && (!shard_ || dim_ == other.dim_);
  }
  bool operator!=(const Placement& other) const { return !(*this == other); }

 private:
  Placement(bool shard, int64_t dim) : shard_(shard), dim_(dim) {}
  bool shard_;
  int64_t dim_;
};

/// torch.distributed.tensor.Replicate().
inline Placement Replicate() { return Placement::replicate(); }
/// torch.distributed.tensor.Shard(dim).
inline Placement Shard(int64_t dim) { return Placement::shard(dim); }

/// torch.distributed.tensor.parallel.ColwiseParallel: a Linear's weight and bias split
/// along the output features (an Embedding's weight along the embedding dimension). The
/// input is whole (Replicate) or, with input_layouts(Shard(d)), the rank's slice along d,
/// all-gathered first (sequence parallelism before it). The output is the rank's slice of
/// the last dimension (Shard(-1)), or with output_layouts(Replicate()) all-gathered.
struct ColwiseParallel {
  TORCH_ARG(Placement, input_layouts) = Replicate();
  TORCH_ARG(Placement, output_layouts) = Shard(-1);
  /// Outputs are plain tensors here (there is no DTensor); false is refused.
  TORCH_ARG(bool, use_local_output) = true;
};

/// torch.distributed.tensor.parallel.RowwiseParallel: a Linear's weight split along the
/// input features (its bias whole, added once after the reduction); an Embedding's weight
/// along its rows (each rank looks up the indices in its rows, zeros elsewhere). The input
/// is the rank's slice of the last dimension (Shard(-1), as a ColwiseParallel layer gives
/// it) or, with input_layouts(Replicate()), whole and cut here (an Embedding's indices are
/// always whole). The partial outputs are all-reduced (Replicate) or, with
/// output_layouts(Shard(d)), reduce-scattered along d (sequence parallelism after it).
struct RowwiseParallel {
  TORCH_ARG(Placement, input_layouts) = Shard(-1);
  TORCH_ARG(Placement, output_layouts) = Replicate();
  TORCH_ARG(bool, use_local_output) = true;
};

/// torch.distributed.tensor.parallel.SequenceParallel: the module (LayerNorm, dropout,
/// or any module whose computation is per position) runs on the rank's slice of the
/// sequence: its input and output are Shard(sequence_dim). Its parameters stay whole on
/// every rank, and their gradients are summed over the group in backward (each rank saw
/// part of the sequence).
struct SequenceParallel {
  TORCH_ARG(int64_t, sequence_dim) = 1;
  TORCH_ARG(bool, use_local_output) = true;
};

/// One of the styles.
using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel>;

/// Module path (as named_modules() spells it, relative to the module given to
/// parallelize_module) to style. `*` matches any run of characters within one part of the
/// path (between dots) and `?` one character, as PyTorch's fnmatch on each part:
/// "blocks.*.mlp.fc". Entries are applied in order; a module named by two entries is
/// refused.
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyle>>;

namespace detail {
struct TensorParallelState;
}  // namespace detail

/// The module-independent part of TensorParallelImpl<M>.
class TensorParallelBase : public torch::nn::Module {
 public:
  TensorParallelBase(const TensorParallelBase&) = delete;
  TensorParallelBase& operator=(const TensorParallelBase&) = delete;

  /// Whether parallelize_module applied a style (until then a plain pass-through).
  bool is_parallel() const { return state_ != nullptr; }
  /// The tensor-parallel group; nullptr before a style is applied.
  std::shared_ptr<ProcessGroup> group() const;
  /// The wrapped module, type-erased.
  const std::shared_ptr<torch::nn::Module>& module_ptr() const { return module_; }
  /// Applies `style` over `group` (what parallelize_module does for each module it
  /// names): shards the parameters and sets the forward's communication.
  void apply(const ParallelStyle& style, std::shared_ptr<ProcessGroup> group,
             const std::string& path);

  void train(bool on = true) override;

 protected:
  explicit TensorParallelBase(std::shared_ptr<torch::nn::Module> module);
  /// The style's forward around `call` (the module's forward on one tensor).
  at::Tensor run(const at::Tensor& input,
                 const std::function<at::Tensor(const at::Tensor&)>& call) const;

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<detail::TensorParallelState> state_;
};

/// Module M with a tensor-parallel style around its forward (one tensor in, one out).
/// Made by parallelize_module in a container's place, or declared as a field
/// (ddp::TensorParallel<torch::nn::LinearImpl>) and a plain M until a plan names it.
template <typename M>
class TensorParallelImpl : public TensorParallelBase {
 public:
  explicit TensorParallelImpl(std::shared_ptr<M> module)
      : TensorParallelBase(module), typed_(std::move(module)) {}
  /// M constructed from `args` (so that a field reads like M's own holder).
  template <typename... Args,
            typename = std::enable_if_t<std::is_constructible<M, Args&&...>::value>>
  explicit TensorParallelImpl(Args&&... args)
      : TensorParallelImpl(std::make_shared<M>(std::forward<Args>(args)...)) {}

  const std::shared_ptr<M>& module() const { return typed_; }
  M* operator->() const { return typed_.get(); }

  at::Tensor forward(const at::Tensor& input) {
    return run(input, [this](const at::Tensor& x) { return typed_->forward(x); });
  }

 private:
  std::shared_ptr<M> typed_;
};

/// The holder of TensorParallelImpl<M>, for fields:
///   ddp::TensorParallel<torch::nn::LinearImpl> fc1{nullptr};
///   fc1 = register_module("fc1", ddp::TensorParallel<torch::nn::LinearImpl>(64, 256));
template <typename M>
class TensorParallel : public torch::nn::ModuleHolder<TensorParallelImpl<M>> {
 public:
  using torch::nn::ModuleHolder<TensorParallelImpl<M>>::ModuleHolder;
};

/// torch.distributed.tensor.parallel.parallelize_module: applies `plan` to `module`'s
/// submodules over `mesh` (1-D: the tensor-parallel ranks; with more dimensions, name
/// one with `mesh["tp"]`). Every rank of the mesh calls it with the same plan; parameters
/// must be equal on every rank (each keeps its part). Returns `module`. A module the plan
/// names that is not a Linear or Embedding (Colwise, Rowwise), a pattern that matches
/// nothing, or a module held by a typed field (Note [Parallel modules take their module's
/// place]) is refused before anything changes.
torch::nn::Module& parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh,
                                      const ParallelizePlan& plan);
/// The same over a group instead of a mesh.
torch::nn::Module& parallelize_module(torch::nn::Module& module,
                                      std::shared_ptr<ProcessGroup> group,
                                      const ParallelizePlan& plan);

/// How a tensor-parallel parameter is split (for checkpoints and state dicts): its dim,
/// full size, group; nullopt for a parameter that no style split.
struct TensorParallelShard {
  std::shared_ptr<ProcessGroup> group;
  int64_t dim = 0;
  std::vector<int64_t> full_size;
  /// This rank's first index along dim.
  int64_t offset = 0;
};
std::optional<TensorParallelShard> tensor_parallel_shard(const at::Tensor& parameter);

}  // namespace ddp
