#pragma once

// Fully sharded data parallel: ddp::fully_shard, PyTorch's FSDP2
// (torch.distributed.fsdp.fully_shard) for LibTorch modules. Each rank keeps 1/N of every
// parameter, of its gradient and of the optimizer state; a unit's full parameters exist
// only while its forward or backward runs. Design and the table against FSDP2's API:
// docs/fsdp.md.
//
// Example (every rank runs this; blocks in a Sequential or a ModuleList):
//   ddp::init_process_group();
//   auto model = std::make_shared<GptImpl>(config);
//   for (auto& block : *model->blocks) ddp::fully_shard(block);   // each block a unit
//   auto fsdp = ddp::fully_shard(model);                          // the root, last
//   torch::optim::AdamW opt(fsdp->parameters(), 3e-4);            // sees the shards
//   for (...) {
//     auto loss = torch::nn::functional::cross_entropy(fsdp(x), y);
//     loss.backward();             // gradients reduce-scattered to the shards
//     ddp::clip_grad_norm_(fsdp->parameters(), 1.0);
//     opt.step(); opt.zero_grad();
//   }
//   auto state = ddp::full_state_dict(*fsdp);   // rank 0: the unwrapped model's keys
//
// Note [Units take their module's place]
// A LibTorch module's forward is a plain member function called through its parent's
// typed field or through a container; there are no forward hooks. So a unit runs its
// schedule in a module of ours, FullyShardImpl<M>, whose forward has M's signature and
// calls M's forward in between. fully_shard(root) puts each unit's FullyShardImpl in
// place of its module wherever the tree holds it (the parent's registry, Sequential,
// ModuleList, ModuleDict), as convert_sync_batchnorm does. A unit registers its module's
// parameters, buffers and children as its own, under the same names, so state dicts,
// named_parameters() and optimizers see the same keys and the same tensors as the
// unwrapped model. A typed field of the module's own type cannot hold the unit: declare
// it as ddp::FullyShard<BlockImpl> (a plain pass-through until fully_shard is applied to
// it), or reach the block through a container. fully_shard(root) refuses a tree in which
// a unit's module is still held elsewhere, before it changes anything.

#include <ddp/distributed/device_mesh.h>
#include <ddp/distributed/process_group.h>
#include <ddp/modules/output_tensors.h>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>
#include <ATen/core/Dict.h>

#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace ddp {

/// torch.distributed.fsdp.MixedPrecisionPolicy.
///
/// Example: bf16 compute and communication of parameters, fp32 shards, gradients
/// reduced in fp32:
///   ddp::MixedPrecisionPolicy().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat)
struct MixedPrecisionPolicy {
  /// The dtype of the full parameters during forward and backward (and of the
  /// all-gather). nullopt: the parameters' own dtype. The shards keep their dtype.
  TORCH_ARG(c10::optional<at::ScalarType>, param_dtype) = c10::nullopt;
  /// The dtype gradients are reduce-scattered in. nullopt: the parameters' own dtype.
  /// The sharded gradients always have the shards' dtype.
  TORCH_ARG(c10::optional<at::ScalarType>, reduce_dtype) = c10::nullopt;
  /// The dtype the root's floating-point outputs are cast to. nullopt: no cast.
  TORCH_ARG(c10::optional<at::ScalarType>, output_dtype) = c10::nullopt;
  /// Cast a unit's floating-point tensor inputs to param_dtype before its forward.
  TORCH_ARG(bool, cast_forward_inputs) = true;
};

/// Options of ddp::fully_shard, with FSDP2's names.
struct FullyShardOptions {
  /// The ranks the parameters are sharded over. nullptr: the default group (or mesh).
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
  /// FSDP2's mesh, instead of process_group. 1-D: the ranks to shard over. 2-D
  /// (replicate, shard): HSDP, as FSDP2's HSDPMeshInfo(shard_mesh_dim=1,
  /// replicate_mesh_dim=0): each row of dimension 1 shards the parameters among its
  /// ranks and reduce-scatters their gradients, then the sharded gradients are
  /// all-reduced (averaged) across dimension 0, whose ranks hold the same shards.
  TORCH_ARG(c10::optional<DeviceMesh>, mesh) = c10::nullopt;
  /// Free the full parameters after the unit's forward and all-gather them again for its
  /// backward (less memory, one more all-gather per step). The root never does: its
  /// parameters are needed at once by backward.
  TORCH_ARG(bool, reshard_after_forward) = true;
  TORCH_ARG(MixedPrecisionPolicy, mp_policy) = MixedPrecisionPolicy();
};

namespace detail {

class ShardUnit;

// The non-template side of FullyShardImpl (src/fsdp/fully_shard.cpp).

/// Before the module's forward: the root's step, the all-gather, the inputs' hooks.
/// Returns the tensor inputs to pass on (cast, and marked for post-backward).
std::vector<at::Tensor> unit_pre_forward(ShardUnit& unit, std::vector<at::Tensor> inputs);
/// After it: the outputs' pre-backward hook and the reshard. `outputs` are the output's
/// tensors (known = false: a type whose tensors cannot be found; the unit then stays
/// unsharded until its backward is over). Returns the tensors to put back.
std::vector<at::Tensor> unit_post_forward(ShardUnit& unit, std::vector<at::Tensor> outputs,
                                          bool known);
/// The forward threw: leave no step half begun.
void unit_forward_failed(ShardUnit& unit);
/// Refuses a forward inside a function that ddp::checkpoint recomputes, saying `fix`
/// (activation_checkpoint.h; a unit's hooks would be dropped with that function's graph).
void check_outside_checkpoint(const std::string& what, const std::string& fix);

/// Puts each tensor of T back from `tensors` in the order OutputTensors<T> collects them.
template <typename T, typename = void>
struct ReplaceTensors {
  static void apply(T&, const std::vector<at::Tensor>&, size_t&) {}
};
template <>
struct ReplaceTensors<at::Tensor> {
  static void apply(at::Tensor& t, const std::vector<at::Tensor>& v, size_t& i) {
    if (t.defined()) t = v[i++];
  }
};
template <typename T>
struct ReplaceTensors<std::vector<T>> {
  static void apply(std::vector<T>& x, const std::vector<at::Tensor>& v, size_t& i) {
    for (auto& e : x) ReplaceTensors<T>::apply(e, v, i);
  }
};
template <typename A, typename B>
struct ReplaceTensors<std::pair<A, B>> {
  static void apply(std::pair<A, B>& x, const std::vector<at::Tensor>& v, size_t& i) {
    ReplaceTensors<A>::apply(x.first, v, i);
    ReplaceTensors<B>::apply(x.second, v, i);
  }
};
template <typename... Ts>
struct ReplaceTensors<std::tuple<Ts...>> {
  static void apply(std::tuple<Ts...>& x, const std::vector<at::Tensor>& v, size_t& i) {
    std::apply(
        [&](auto&... e) { (ReplaceTensors<std::decay_t<decltype(e)>>::apply(e, v, i), ...); }, x);
  }
};

/// Whether the output type's tensors can be found and replaced (not c10::IValue,
/// std::optional: found but not replaced here).
template <typename T>
struct Replaceable : std::false_type {};
template <>
struct Replaceable<at::Tensor> : std::true_type {};
template <typename T>
struct Replaceable<std::vector<T>> : Replaceable<T> {};
template <typename A, typename B>
struct Replaceable<std::pair<A, B>>
    : std::integral_constant<bool, Replaceable<A>::value && Replaceable<B>::value> {};
template <typename... Ts>
struct Replaceable<std::tuple<Ts...>>
    : std::integral_constant<bool, (Replaceable<Ts>::value && ... && true)> {};

template <typename... Args>
struct TensorArgs {
  static constexpr std::array<bool, sizeof...(Args) + 1> is_tensor{
      {std::is_same<std::decay_t<Args>, at::Tensor>::value..., false}};
  /// Position of argument i among the tensor arguments.
  static constexpr size_t index_of(size_t i) {
    size_t n = 0;
    for (size_t j = 0; j < i; ++j) n += is_tensor[j] ? 1 : 0;
    return n;
  }
};

}  // namespace detail

/// The module-independent part of a unit: what FSDP2's FSDPModule adds to a module.
class FullyShardBase : public torch::nn::Module {
 public:
  FullyShardBase(const FullyShardBase&) = delete;
  FullyShardBase& operator=(const FullyShardBase&) = delete;

  /// All-gathers the full parameters now (FSDPModule.unshard); they stay until
  /// reshard() or the end of the next backward.
  void unshard();
  /// Frees the full parameters; the module's parameters are the shards again.
  void reshard();
  /// false: backward keeps the unit's full gradients and accumulates into them; the
  /// next backward with true reduce-scatters the sum (DDP's no_sync). `recurse`: also
  /// the units nested inside this one.
  void set_requires_gradient_sync(bool requires_gradient_sync, bool recurse = true);
  /// HSDP (a 2-D mesh): whether backward all-reduces the sharded gradients across the
  /// replicate dimension (FSDP2's set_requires_all_reduce). False keeps them reduced
  /// within the shard group only and adds them up, unset in .grad(), until a backward
  /// with it true all-reduces the sum: gradient accumulation that communicates within
  /// a host only. No effect without a replicate dimension.
  void set_requires_all_reduce(bool requires_all_reduce, bool recurse = true);
  /// Changes reshard_after_forward (not for the root; see FullyShardOptions).
  void set_reshard_after_forward(bool reshard_after_forward, bool recurse = true);
  /// The options this unit was sharded with.
  const FullyShardOptions& options() const;
  /// Whether fully_shard was applied (a FullyShard<M> declared as a field is a plain
  /// pass-through until then).
  bool is_sharded() const;

  void train(bool on = true) override;

  /// The wrapped module, type-erased.
  const std::shared_ptr<torch::nn::Module>& module_ptr() const { return module_; }
  detail::ShardUnit& unit() const { return *unit_; }

 protected:
  explicit FullyShardBase(std::shared_ptr<torch::nn::Module> module);
  void shard(const FullyShardOptions& options, std::function<torch::nn::AnyModule()> as_any);

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<detail::ShardUnit> unit_;
};

/// A unit: module M with FSDP2's schedule around its forward. Made by ddp::fully_shard;
/// calls M's forward with M's signature (so a Sequential can hold it).
template <typename M, typename = void>
class FullyShardImpl;

namespace detail {
template <typename M, typename Self, typename R, typename... Args>
R fully_shard_forward(Self& self, M& module, Args&&... args);
}  // namespace detail

/// M's forward is a template or overloaded (torch::nn::Sequential): a forward that takes
/// anything M's does.
template <typename M, typename>
class FullyShardImpl : public FullyShardBase {
 public:
  explicit FullyShardImpl(std::shared_ptr<M> module)
      : FullyShardBase(module), typed_(std::move(module)) {}
  const std::shared_ptr<M>& module() const { return typed_; }
  template <typename... Args>
  auto forward(Args&&... args) {
    using R = decltype(typed_->forward(std::forward<Args>(args)...));
    return detail::fully_shard_forward<M, FullyShardImpl, R, Args&&...>(*this, *typed_,
                                                                        std::forward<Args>(
                                                                            args)...);
  }
  void shard_with(const FullyShardOptions& options) { this->shard(options, nullptr); }

 private:
  std::shared_ptr<M> typed_;
};

namespace detail {
template <typename F>
struct ForwardSignature;
template <typename C, typename R, typename... Args>
struct ForwardSignature<R (C::*)(Args...)> {
  using Result = R;
  using Arguments = std::tuple<Args...>;
};
template <typename C, typename R, typename... Args>
struct ForwardSignature<R (C::*)(Args...) const> : ForwardSignature<R (C::*)(Args...)> {};
template <typename M, typename Sig>
class TypedUnit;
}  // namespace detail

/// M has one non-template forward: the unit's forward has the same signature.
template <typename M>
class FullyShardImpl<M, std::void_t<decltype(&M::forward)>>
    : public detail::TypedUnit<
          M, typename detail::ForwardSignature<decltype(&M::forward)>::Arguments> {
  using Base =
      detail::TypedUnit<M, typename detail::ForwardSignature<decltype(&M::forward)>::Arguments>;

 public:
  explicit FullyShardImpl(std::shared_ptr<M> module) : Base(std::move(module)) {}
};

namespace detail {
template <typename M, typename... Args>
class TypedUnit<M, std::tuple<Args...>> : public FullyShardBase {
 public:
  using Result = typename ForwardSignature<decltype(&M::forward)>::Result;
  explicit TypedUnit(std::shared_ptr<M> module)
      : FullyShardBase(module), typed_(std::move(module)) {}
  const std::shared_ptr<M>& module() const { return typed_; }
  Result forward(Args... args) {
    return fully_shard_forward<M, TypedUnit, Result, Args&&...>(*this, *typed_,
                                                                std::forward<Args>(args)...);
  }
  void shard_with(const FullyShardOptions& options) {
    auto self = std::static_pointer_cast<FullyShardImpl<M>>(this->shared_from_this());
    this->shard(options, [self] { return torch::nn::AnyModule(self); });
  }

 private:
  std::shared_ptr<M> typed_;
};

template <size_t I, typename Arg>
decltype(auto) unit_argument(Arg&& arg, const std::vector<at::Tensor>& tensors, size_t index) {
  if constexpr (std::is_same<std::decay_t<Arg>, at::Tensor>::value) {
    return at::Tensor(tensors[index]);
  } else {
    return std::forward<Arg>(arg);
  }
}

template <typename M, typename R, typename Tuple, size_t... I>
R call_with(M& module, Tuple&& args, const std::vector<at::Tensor>& tensors,
            std::index_sequence<I...>) {
  using Info = TensorArgs<std::tuple_element_t<I, std::decay_t<Tuple>>...>;
  return module.forward(
      unit_argument<I>(std::get<I>(std::forward<Tuple>(args)), tensors, Info::index_of(I))...);
}

template <typename M, typename Self, typename R, typename... Args>
R fully_shard_forward(Self& self, M& module, Args&&... args) {
  if (!self.is_sharded()) return module.forward(std::forward<Args>(args)...);
  check_outside_checkpoint(self.name(),
                           "Wrap the block first and shard the wrapper, so that the checkpoint "
                           "sits inside the unit: ddp::apply_activation_checkpointing<Block>"
                           "(model) or ddp::checkpoint_wrapper(block), then ddp::fully_shard.");
  std::vector<at::Tensor> inputs;
  auto collect = [&inputs](const auto& arg) {
    if constexpr (std::is_same<std::decay_t<decltype(arg)>, at::Tensor>::value) {
      inputs.push_back(arg);
    }
  };
  (collect(args), ...);
  ShardUnit& unit = self.unit();
  try {
    inputs = unit_pre_forward(unit, std::move(inputs));
    R output = call_with<M, R>(module, std::forward_as_tuple(std::forward<Args>(args)...), inputs,
                               std::index_sequence_for<Args...>{});
    using Out = std::decay_t<R>;
    std::vector<at::Tensor> outputs;
    if constexpr (Replaceable<Out>::value) {
      OutputTensors<Out>::collect(output, outputs);
      outputs = unit_post_forward(unit, std::move(outputs), true);
      size_t i = 0;
      ReplaceTensors<Out>::apply(output, outputs, i);
    } else {
      unit_post_forward(unit, {}, false);
    }
    return output;
  } catch (...) {
    unit_forward_failed(unit);
    throw;
  }
}
}  // namespace detail

/// A ModuleHolder over FullyShardImpl<M>: unit(x), unit->forward(x), unit->module(),
/// unit->parameters() (the shards, with M's keys).
///
/// As a field, declared before fully_shard is applied, it is a plain pass-through:
///   struct NetImpl : torch::nn::Module {
///     NetImpl() : block(register_module("block", ddp::FullyShard<BlockImpl>(
///                     std::make_shared<BlockImpl>()))) {}
///     torch::Tensor forward(torch::Tensor x) { return block(x); }
///     ddp::FullyShard<BlockImpl> block;
///   };
///   ddp::fully_shard(net->block);  // shards it; net->block now runs FSDP2's schedule
template <typename M>
class FullyShard : public torch::nn::ModuleHolder<FullyShardImpl<M>> {
  using Holder = torch::nn::ModuleHolder<FullyShardImpl<M>>;

 public:
  /* implicit */ FullyShard(std::nullptr_t) : Holder(nullptr) {}
  /* implicit */ FullyShard(std::shared_ptr<FullyShardImpl<M>> impl) : Holder(std::move(impl)) {}
  /// An unsharded pass-through around `module`, with its keys.
  explicit FullyShard(std::shared_ptr<M> module)
      : Holder(std::make_shared<FullyShardImpl<M>>(std::move(module))) {}

  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return this->get()->forward(std::forward<Args>(args)...);
  }
};

namespace detail {
/// Refuses a module that is already a unit's, or inside one (names it).
void check_can_shard(const torch::nn::Module& module);
}  // namespace detail

/// Shards `module`'s parameters over the group (each along dim 0, padded to a multiple
/// of the world size; the module's parameters become this rank's shards) and returns the
/// unit that runs it. Apply bottom-up: blocks first, the root last; fully_shard(root)
/// also puts every unit in its module's place in the tree (Note [Units take their
/// module's place]). Collective: every rank of the group calls it in the same order.
/// The parameters must be equal on every rank (checked; MismatchError names the first
/// that differs). Build optimizers from parameters() afterwards.
///
/// Errors (each names the module): applied twice, or to a module inside one already
/// sharded; sparse parameters; parameters owned by DistributedDataParallel; a
/// module whose unit a typed field still holds (fully_shard(root)).
template <typename M>
FullyShard<M> fully_shard(const std::shared_ptr<M>& module,
                          const FullyShardOptions& options = FullyShardOptions()) {
  static_assert(std::is_base_of<torch::nn::Module, M>::value,
                "ddp::fully_shard takes a torch::nn::Module");
  static_assert(!std::is_base_of<FullyShardBase, M>::value,
                "ddp::fully_shard: pass the ddp::FullyShard<M> holder, not its impl");
  TORCH_CHECK(module != nullptr, "ddp::fully_shard got a null module; construct it first.");
  detail::check_can_shard(*module);
  auto unit = std::make_shared<FullyShardImpl<M>>(module);
  unit->shard_with(options);
  return FullyShard<M>(std::move(unit));
}
template <typename M>
FullyShard<M> fully_shard(const torch::nn::ModuleHolder<M>& module,
                          const FullyShardOptions& options = FullyShardOptions()) {
  TORCH_CHECK(!module.is_empty(),
              "ddp::fully_shard got an empty module holder; construct it first.");
  return fully_shard(module.ptr(), options);
}
template <typename M>
FullyShard<M> fully_shard(FullyShard<M>& unit,
                          const FullyShardOptions& options = FullyShardOptions()) {
  TORCH_CHECK(!unit.is_empty(), "ddp::fully_shard got an empty FullyShard; construct it first.");
  unit->shard_with(options);
  return unit;
}
/// A step of a unit's schedule, as reported to a FullyShardObserver.
enum class FullyShardEvent {
  kAllGatherStarted,       ///< the all-gather of the unit's shards was launched
  kUnsharded,              ///< its parameters are full (the all-gather was waited for)
  kResharded,              ///< its full parameters were freed; the shards are back
  kReduceScatterStarted,   ///< its full gradients were copied out and the reduce-scatter launched
  kReduceScatterFinished,  ///< the reduce-scatter was waited for; sharded gradients updated
  /// HSDP: the reduce-scatter was waited for and the all-reduce across replicas launched
  /// (kReduceScatterFinished follows once it is waited for, one unit's backward later).
  kAllReduceStarted,
};
/// "all_gather_started", "unsharded", ...
const char* to_string(FullyShardEvent event);
/// Called right after each event, on the thread that caused it (the training thread or
/// autograd's), with the unit's place in its root's tree ("blocks.3", "" for the root;
/// before the root's first forward, the module's name). For diagnostics: memory timelines
/// (ddp::cpu_memory_stats), traces. It must not call into the model or run collectives.
using FullyShardObserver = std::function<void(FullyShardEvent, const std::string& unit)>;
/// Installs `observer` for every unit of this process (nullptr: none, the default).
void set_fully_shard_observer(FullyShardObserver observer);

/// The global norm of the gradients of `parameters` (norm_type: 2, 1, or infinity), with
/// each sharded gradient counted once across the ranks of its unit's group, each
/// tensor-parallel chunk once across its group (ddp::parallelize_module; both for a chunk
/// that fully_shard shards further), and every other gradient once; scales them all by
/// max_norm / (norm + 1e-6) when the norm exceeds max_norm, as
/// torch.nn.utils.clip_grad_norm_. Collective over those groups (none when no parameter is
/// split). Returns the norm.
at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                           double norm_type = 2.0);

/// The unwrapped model's state dict on rank 0: its keys and order (as
/// ddp::model_state_dict gives for the model before fully_shard), parameters full, on the
/// CPU; empty on the other ranks (PyTorch's get_model_state_dict with
/// full_state_dict=True, cpu_offload=True). Collective. Save it with
/// ddp::save_state_dict for Python's torch.load.
c10::Dict<std::string, at::Tensor> full_state_dict(torch::nn::Module& model);
/// Loads a full state dict (present on every rank, or on rank 0 only with
/// `from_rank0`: then broadcast) into a sharded model: each rank keeps its rows.
/// Collective. Names the missing, unexpected or misshapen key.
void load_full_state_dict(torch::nn::Module& model, const c10::Dict<std::string, at::Tensor>& state,
                          bool from_rank0 = false);

}  // namespace ddp
