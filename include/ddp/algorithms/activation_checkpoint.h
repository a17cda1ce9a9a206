#pragma once

// Activation checkpointing for LibTorch: torch.utils.checkpoint.checkpoint(fn, *args,
// use_reentrant=False) as ddp::checkpoint, and PyTorch's checkpoint_wrapper /
// apply_activation_checkpointing (torch.distributed.algorithms._checkpoint, what
// torchtitan applies before fully_shard) as ddp::checkpoint_wrapper /
// ddp::apply_activation_checkpointing. The forward of a checkpointed function keeps none
// of the activations it computes; backward runs the function again, with the forward's
// RNG and autocast state, and differentiates that. Gradients equal the un-checkpointed
// run's bit for bit on a CPU. Semantics against PyTorch's, the design and what composes
// with what: docs/activation_checkpointing.md.
//
// Example, the function form (inside a module's forward). fn is called again during
// backward, after this forward has returned: capture by value ([this], [=]), never a
// local variable by reference.
//   at::Tensor BlockImpl::forward(at::Tensor x) {
//     x = x + attn(ln_1(x));                                   // kept as usual
//     return ddp::checkpoint([this](const at::Tensor& h) { return h + mlp(ln_2(h)); }, x);
//   }
//
// Example, the module form, in torchtitan's order with fully_shard (the checkpoint
// inside each unit):
//   auto model = std::make_shared<GptImpl>(config);            // blocks in a Sequential
//   ddp::apply_activation_checkpointing<BlockImpl>(*model);    // each Block wrapped in place
//   for (size_t i = 0; i < model->blocks->size(); ++i)
//     ddp::fully_shard(model->blocks->ptr<ddp::CheckpointWrapperImpl<BlockImpl>>(i));
//   auto fsdp = ddp::fully_shard(model);
//   // One module: auto block = ddp::checkpoint_wrapper(std::make_shared<BlockImpl>());
//
// The wrapper registers its module's parameters, buffers and children as its own, under
// the same names (as a fully_shard unit does, Note [Units take their module's place] in
// fully_shard.h), so state dicts, named_parameters() and optimizers see the same keys and
// the same tensors as the unwrapped model.

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace ddp {

/// Options of ddp::checkpoint and ddp::checkpoint_wrapper, with PyTorch's names.
///
/// Example: ddp::ActivationCheckpointOptions().preserve_rng_state(false)
struct ActivationCheckpointOptions {
  /// Give the recompute the forward's RNG state (the CPU generator, and the CUDA
  /// generators of the devices of the tensor arguments), so dropout draws the same mask,
  /// and fork it: the recompute does not advance the program's RNG streams. false: the
  /// recompute draws from the generators as they are then (cheaper; for functions
  /// without randomness).
  TORCH_ARG(bool, preserve_rng_state) = true;
};

namespace detail {

/// The type-erased function: the tensor arguments in, the output tensors out.
using CheckpointFunction = std::function<std::vector<at::Tensor>(std::vector<at::Tensor>)>;

/// The core of ddp::checkpoint (src/algorithms/activation_checkpoint.cpp): runs fn on
/// `inputs` and returns its output tensors, which backward reaches through one node that
/// recomputes fn. `what` names the caller in error messages.
std::vector<at::Tensor> checkpoint_tensors(const ActivationCheckpointOptions& options,
                                           CheckpointFunction fn, std::vector<at::Tensor> inputs,
                                           const std::string& what);

/// Refuses a forward (of `what`, e.g. DistributedDataParallel) that runs inside a
/// checkpointed function (its forward or its recompute), saying `fix`.
/// DistributedDataParallel and fully_shard call it before their forward.
void check_outside_checkpoint(const std::string& what, const std::string& fix);

/// An argument of ddp::checkpoint: its tensors are the function's inputs (taken out of
/// the stored arguments, put back for each call); anything else is copied as it is.
template <typename T>
struct CheckpointArg {
  static void take(T&, std::vector<at::Tensor>&) {}
  static void put(T&, const std::vector<at::Tensor>&, size_t&) {}
};
template <>
struct CheckpointArg<at::Tensor> {
  static void take(at::Tensor& t, std::vector<at::Tensor>& out) {
    out.push_back(std::move(t));
    t = at::Tensor();
  }
  static void put(at::Tensor& t, const std::vector<at::Tensor>& in, size_t& i) { t = in[i++]; }
};
template <>
struct CheckpointArg<std::vector<at::Tensor>> {
  static void take(std::vector<at::Tensor>& v, std::vector<at::Tensor>& out) {
    for (auto& t : v) CheckpointArg<at::Tensor>::take(t, out);
  }
  static void put(std::vector<at::Tensor>& v, const std::vector<at::Tensor>& in, size_t& i) {
    for (auto& t : v) CheckpointArg<at::Tensor>::put(t, in, i);
  }
};

/// What fn may return: tensors, std::vector, std::tuple and std::pair of them, and plain
/// values beside them (numbers, strings: returned as the forward computed them).
template <typename T, typename = void>
struct CheckpointResult {
  static constexpr bool supported =
      std::is_arithmetic<T>::value || std::is_enum<T>::value || std::is_same<T, std::string>::value;
  static void collect(const T&, std::vector<at::Tensor>&) {}
  static void replace(T&, const std::vector<at::Tensor>&, size_t&) {}
};
template <>
struct CheckpointResult<at::Tensor> {
  static constexpr bool supported = true;
  static void collect(const at::Tensor& t, std::vector<at::Tensor>& out) {
    if (t.defined()) out.push_back(t);
  }
  static void replace(at::Tensor& t, const std::vector<at::Tensor>& v, size_t& i) {
    if (t.defined()) t = v[i++];
  }
};
template <typename T>
struct CheckpointResult<std::vector<T>> {
  static constexpr bool supported = CheckpointResult<T>::supported;
  static void collect(const std::vector<T>& x, std::vector<at::Tensor>& out) {
    for (const auto& e : x) CheckpointResult<T>::collect(e, out);
  }
  static void replace(std::vector<T>& x, const std::vector<at::Tensor>& v, size_t& i) {
    for (auto& e : x) CheckpointResult<T>::replace(e, v, i);
  }
};
template <typename A, typename B>
struct CheckpointResult<std::pair<A, B>> {
  static constexpr bool supported =
      CheckpointResult<A>::supported && CheckpointResult<B>::supported;
  static void collect(const std::pair<A, B>& x, std::vector<at::Tensor>& out) {
    CheckpointResult<A>::collect(x.first, out);
    CheckpointResult<B>::collect(x.second, out);
  }
  static void replace(std::pair<A, B>& x, const std::vector<at::Tensor>& v, size_t& i) {
    CheckpointResult<A>::replace(x.first, v, i);
    CheckpointResult<B>::replace(x.second, v, i);
  }
};
template <typename... Ts>
struct CheckpointResult<std::tuple<Ts...>> {
  static constexpr bool supported = (CheckpointResult<Ts>::supported && ... && true);
  static void collect(const std::tuple<Ts...>& x, std::vector<at::Tensor>& out) {
    std::apply(
        [&](const auto&... e) {
          (CheckpointResult<std::decay_t<decltype(e)>>::collect(e, out), ...);
        },
        x);
  }
  static void replace(std::tuple<Ts...>& x, const std::vector<at::Tensor>& v, size_t& i) {
    std::apply(
        [&](auto&... e) { (CheckpointResult<std::decay_t<decltype(e)>>::replace(e, v, i), ...); },
        x);
  }
};

template <typename F, typename... Args>
auto checkpoint_call(const ActivationCheckpointOptions& options, const std::string& what, F&& fn,
                     Args&&... args) {
  using Stored = std::tuple<std::decay_t<Args>...>;
  using Fn = std::decay_t<F>;
  using R = std::decay_t<std::invoke_result_t<Fn&, std::decay_t<Args>&...>>;
  static_assert(CheckpointResult<R>::supported,
                "ddp::checkpoint: fn must return at::Tensor, std::vector<at::Tensor>, or a "
                "std::tuple / std::pair of tensors (and plain values)");
  Stored stored(std::forward<Args>(args)...);
  std::vector<at::Tensor> inputs;
  std::apply([&](auto&... a) { (CheckpointArg<std::decay_t<decltype(a)>>::take(a, inputs), ...); },
             stored);
  // The first call (the forward) hands its whole result back through `slot`; the
  // recompute in backward, long after this frame is gone, finds the slot expired.
  auto slot = std::make_shared<std::optional<R>>();
  struct Closure {
    Fn fn;
    Stored args;  // tensors taken out: placeholders
    std::weak_ptr<std::optional<R>> slot;
  };
  auto closure =
      std::make_shared<Closure>(Closure{Fn(std::forward<F>(fn)), std::move(stored), slot});
  CheckpointFunction erased = [closure](std::vector<at::Tensor> tensors) {
    Stored call_args = closure->args;
    size_t i = 0;
    std::apply(
        [&](auto&... a) { (CheckpointArg<std::decay_t<decltype(a)>>::put(a, tensors, i), ...); },
        call_args);
    tensors.clear();  // hold the arguments no longer than fn does
    R result = std::apply(closure->fn, call_args);
    std::vector<at::Tensor> out;
    CheckpointResult<R>::collect(result, out);
    if (auto s = closure->slot.lock()) *s = std::move(result);
    return out;
  };
  std::vector<at::Tensor> outputs =
      checkpoint_tensors(options, std::move(erased), std::move(inputs), what);
  R result = std::move(**slot);
  size_t i = 0;
  CheckpointResult<R>::replace(result, outputs, i);
  return result;
}

}  // namespace detail

/// torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False): returns fn(args...),
/// without keeping the activations fn computes; backward calls fn again on the same
/// arguments (with the forward's RNG and autocast state) and differentiates it. The
/// gradients equal those of fn(args...) called directly.
///
///   fn     a callable: a lambda, a std::function, a functor. Called once here and once
///          per backward, after the caller returned: it must capture by value ([this],
///          [=]; a module's forward), compute the same thing each time, and leave its
///          arguments unmodified.
///   args   at::Tensor and std::vector<at::Tensor> arguments are fn's inputs (their
///          gradients flow back to them); others (numbers, options) are copied and passed
///          again to the recompute.
///   result at::Tensor, std::vector<at::Tensor>, a std::tuple or std::pair of tensors
///          (plain values beside them are returned as computed).
///
/// The parameters fn uses need not be passed: gradients reach every leaf tensor fn uses
/// (found from fn's autograd graph), also when no argument requires grad (where PyTorch's
/// use_reentrant=True would give none). A tensor that requires grad and was computed
/// outside fn must be an argument, not captured (refused, naming it). Outputs that need
/// no gradient are returned as they are (no recompute is kept for them), as PyTorch does.
/// Under NoGradGuard (evaluation) fn simply runs.
///
/// Errors: fn returned no tensor; fn modified an argument in place; backward a second
/// time without retain_graph; an argument or a parameter modified in place between the
/// forward and backward; a recompute that differs from the forward; create_graph
/// (double backward); a DistributedDataParallel or fully_shard forward inside fn
/// (checkpoint inside the model's blocks instead, docs/activation_checkpointing.md).
template <typename F, typename... Args>
auto checkpoint(F&& fn, Args&&... args) -> std::enable_if_t<
    !std::is_same<std::decay_t<F>, ActivationCheckpointOptions>::value,
    std::decay_t<std::invoke_result_t<std::decay_t<F>&, std::decay_t<Args>&...>>> {
  return detail::checkpoint_call(ActivationCheckpointOptions(), "ddp::checkpoint",
                                 std::forward<F>(fn), std::forward<Args>(args)...);
}
/// The same, with options.
template <typename F, typename... Args>
auto checkpoint(const ActivationCheckpointOptions& options, F&& fn, Args&&... args) {
  return detail::checkpoint_call(options, "ddp::checkpoint", std::forward<F>(fn),
                                 std::forward<Args>(args)...);
}

// ---- the module form ----------------------------------------------------------------

/// The module-independent part of a CheckpointWrapper.
class CheckpointWrapperBase : public torch::nn::Module {
 public:
  CheckpointWrapperBase(const CheckpointWrapperBase&) = delete;
  CheckpointWrapperBase& operator=(const CheckpointWrapperBase&) = delete;

  /// The wrapped module, type-erased.
  const std::shared_ptr<torch::nn::Module>& module_ptr() const { return module_; }
  const ActivationCheckpointOptions& options() const { return options_; }
  void train(bool on = true) override;

 protected:
  CheckpointWrapperBase(std::shared_ptr<torch::nn::Module> module,
                        ActivationCheckpointOptions options);
  /// Before each forward with gradients: refuses a wrapped module that contains a
  /// fully_shard unit (the checkpoint must sit inside the unit).
  void check_forward() const;

  std::shared_ptr<torch::nn::Module> module_;
  ActivationCheckpointOptions options_;
};

namespace detail {
template <typename F>
struct CheckpointSignature;
template <typename C, typename R, typename... Args>
struct CheckpointSignature<R (C::*)(Args...)> {
  using Result = R;
  using Arguments = std::tuple<Args...>;
};
template <typename C, typename R, typename... Args>
struct CheckpointSignature<R (C::*)(Args...) const> : CheckpointSignature<R (C::*)(Args...)> {};
/// M's forward is a template or overloaded.
struct TemplateForward {};
template <typename M, typename = void>
struct ForwardArguments {
  using type = TemplateForward;
};
template <typename M>
struct ForwardArguments<M, std::void_t<decltype(&M::forward)>> {
  using type = typename CheckpointSignature<decltype(&M::forward)>::Arguments;
};
}  // namespace detail

/// Module M with every forward checkpointed. Made by ddp::checkpoint_wrapper; calls M's
/// forward with M's signature (so a Sequential can hold it, and Sequential::ptr<
/// CheckpointWrapperImpl<M>>(i) finds it).
template <typename M, typename Arguments = typename detail::ForwardArguments<M>::type>
class CheckpointWrapperImpl;

/// M's forward is a template or overloaded (torch::nn::Sequential): a forward that takes
/// anything M's does.
template <typename M>
class CheckpointWrapperImpl<M, detail::TemplateForward> : public CheckpointWrapperBase {
 public:
  explicit CheckpointWrapperImpl(std::shared_ptr<M> module, ActivationCheckpointOptions options =
                                                                ActivationCheckpointOptions())
      : CheckpointWrapperBase(module, options), typed_(std::move(module)) {}
  const std::shared_ptr<M>& module() const { return typed_; }
  template <typename... Args>
  auto forward(Args&&... args) {
    this->check_forward();
    return detail::checkpoint_call(
        options_, name(), [m = typed_](auto&... a) { return m->forward(a...); },
        std::forward<Args>(args)...);
  }
  /// Empty: a Sequential cannot hold a module whose forward is a template.
  torch::nn::AnyModule as_any() { return torch::nn::AnyModule(); }

 private:
  std::shared_ptr<M> typed_;
};

/// M has one non-template forward: the wrapper's forward has the same signature.
template <typename M, typename... Args>
class CheckpointWrapperImpl<M, std::tuple<Args...>> : public CheckpointWrapperBase {
 public:
  using Result = typename detail::CheckpointSignature<decltype(&M::forward)>::Result;
  explicit CheckpointWrapperImpl(std::shared_ptr<M> module, ActivationCheckpointOptions options =
                                                                ActivationCheckpointOptions())
      : CheckpointWrapperBase(module, options), typed_(std::move(module)) {}
  const std::shared_ptr<M>& module() const { return typed_; }
  Result forward(Args... args) {
    this->check_forward();
    return detail::checkpoint_call(
        options_, name(),
        [m = typed_](std::decay_t<Args>&... a) -> Result {
          return m->forward(std::forward<Args>(a)...);
        },
        std::forward<Args>(args)...);
  }
  torch::nn::AnyModule as_any() {
    return torch::nn::AnyModule(
        std::static_pointer_cast<CheckpointWrapperImpl>(this->shared_from_this()));
  }

 private:
  std::shared_ptr<M> typed_;
};

/// A ModuleHolder over CheckpointWrapperImpl<M>: wrapper(x), wrapper->forward(x),
/// wrapper->module(), wrapper->parameters() (M's, with M's keys). As a field:
///   ddp::CheckpointWrapper<BlockImpl> block{std::make_shared<BlockImpl>()};
template <typename M>
class CheckpointWrapper : public torch::nn::ModuleHolder<CheckpointWrapperImpl<M>> {
  using Holder = torch::nn::ModuleHolder<CheckpointWrapperImpl<M>>;

 public:
  /* implicit */ CheckpointWrapper(std::nullptr_t) : Holder(nullptr) {}
  /* implicit */ CheckpointWrapper(std::shared_ptr<CheckpointWrapperImpl<M>> impl)
      : Holder(std::move(impl)) {}
  explicit CheckpointWrapper(std::shared_ptr<M> module, const ActivationCheckpointOptions& options =
                                                            ActivationCheckpointOptions())
      : Holder(std::make_shared<CheckpointWrapperImpl<M>>(std::move(module), options)) {}

  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return this->get()->forward(std::forward<Args>(args)...);
  }
};

/// FSDP2's checkpoint_wrapper(module): a module whose forward is module's, checkpointed
/// (ddp::checkpoint with module's forward as fn), with module's parameters, buffers and
/// children under their own names. Put it where module was (a Sequential entry, a
/// field of type CheckpointWrapper<M>), or let apply_activation_checkpointing do it. With
/// fully_shard, wrap first and shard the wrapper (the checkpoint inside the unit); a
/// module that already contains a fully_shard unit is refused.
template <typename M>
CheckpointWrapper<M> checkpoint_wrapper(
    const std::shared_ptr<M>& module,
    const ActivationCheckpointOptions& options = ActivationCheckpointOptions()) {
  static_assert(std::is_base_of<torch::nn::Module, M>::value,
                "ddp::checkpoint_wrapper takes a torch::nn::Module");
  TORCH_CHECK(module != nullptr, "ddp::checkpoint_wrapper got a null module; construct it first.");
  return CheckpointWrapper<M>(module, options);
}
template <typename M>
CheckpointWrapper<M> checkpoint_wrapper(
    const torch::nn::ModuleHolder<M>& module,
    const ActivationCheckpointOptions& options = ActivationCheckpointOptions()) {
  TORCH_CHECK(!module.is_empty(),
              "ddp::checkpoint_wrapper got an empty module holder; construct it first.");
  return checkpoint_wrapper(module.ptr(), options);
}

namespace detail {
/// Replaces each module below `root` for which is_target holds with wrap(module)
/// (registry entries and Sequential, ModuleList, ModuleDict entries), after checking
/// that no typed field also holds it. Returns how many were wrapped.
size_t wrap_submodules(
    torch::nn::Module& root, const std::function<bool(const torch::nn::Module&)>& is_target,
    const std::function<std::pair<std::shared_ptr<torch::nn::Module>, torch::nn::AnyModule>(
        const std::shared_ptr<torch::nn::Module>&)>& wrap,
    const std::string& what);
}  // namespace detail

/// FSDP2's apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, M)):
/// wraps every module of type M below `root` (not root itself) in a CheckpointWrapper<M>,
/// in place: registry entries, Sequential, ModuleList and ModuleDict entries. Keys do not
/// change. A module of type M that a typed field holds (`Block block;`) is refused before
/// anything changes (declare the field as ddp::CheckpointWrapper<Block>, or use a
/// container). Apply it before fully_shard. Returns how many modules it wrapped.
template <typename M>
size_t apply_activation_checkpointing(
    torch::nn::Module& root,
    const ActivationCheckpointOptions& options = ActivationCheckpointOptions()) {
  static_assert(std::is_base_of<torch::nn::Module, M>::value,
                "ddp::apply_activation_checkpointing<M>: M must be a torch::nn::Module");
  return detail::wrap_submodules(
      root, [](const torch::nn::Module& m) { return typeid(m) == typeid(M); },
      [options](const std::shared_ptr<torch::nn::Module>& m) {
        auto wrapper =
            std::make_shared<CheckpointWrapperImpl<M>>(std::static_pointer_cast<M>(m), options);
        torch::nn::AnyModule any = wrapper->as_any();
        return std::make_pair(std::shared_ptr<torch::nn::Module>(std::move(wrapper)),
                              std::move(any));
      },
      "ddp::apply_activation_checkpointing");
}

}  // namespace ddp
