#pragma once

// DistributedDataParallel: wrap a LibTorch module, and every loss.backward() leaves each
// rank holding the gradient averaged over all ranks, with communication running while
// backward is still computing. The design is explained in docs/ddp.md.
//
// Example (lesson steps 5-9):
//   ddp::init_process_group();
//   auto model = Net();
//   model->to(ddp::get_device());
//   auto dmodel = ddp::DistributedDataParallel(model, ddp::DistributedDataParallelOptions());
//   torch::optim::SGD optimizer(model->parameters(), /*lr=*/0.01);
//   for (auto& batch : loader) {
//     optimizer.zero_grad();
//     auto loss = torch::nll_loss(dmodel(batch.data), batch.target);  // or dmodel->forward
//     loss.backward();              // gradients are now averaged across ranks
//     optimizer.step();
//   }
//   if (ddp::get_rank() == 0) torch::save(dmodel->module(), "model.pt");

#include <ddp/parallel/comm_hooks.h>
#include <ddp/parallel/distributed_data_parallel_options.h>
#include <ddp/parallel/iteration_stats.h>
#include <ddp/algorithms/join.h>
#include <ddp/modules/output_tensors.h>
#include <ddp/distributed/process_group.h>
#include <ddp/parallel/trace.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace ddp {

class NoSyncGuard;

/// Everything of DistributedDataParallel that does not depend on the wrapped module's
/// type. The wrapped module is registered as the submodule "module", so parameters()
/// and named_parameters() ("module.fc1.weight", as in PyTorch) see its tensors.
class DistributedDataParallelBase : public torch::nn::Module, public Joinable {
 public:
  ~DistributedDataParallelBase() override;

  const DistributedDataParallelOptions& options() const;
  /// The group gradients are reduced over.
  ProcessGroup& process_group() const;

  /// The parameters DDP reduces (those that require grad, each tensor once), by name
  /// in the wrapped module, in its parameters() order. bucket_indices() indexes this.
  const std::vector<std::string>& reduced_parameter_names() const;

  /// Current bucket assignment: per bucket, in launch order, the indices (into
  /// reduced_parameter_names()) of its parameters, in buffer order. Initially reverse
  /// parameter order; after the first reduced iteration, the order in which rank 0's
  /// gradients became ready (see docs/ddp.md, "Bucket rebuild").
  std::vector<std::vector<size_t>> bucket_indices() const;

  /// Measurements of the last reduced iteration (see IterationStats).
  IterationStats last_iteration_stats() const;

  /// Replaces the default all-reduce-and-average with `hook`. Only before the first
  /// backward, and only once.
  void register_comm_hook(std::shared_ptr<CommHook> hook);
  void register_comm_hook(CommHookFn hook);

  /// Inside the returned guard's lifetime, forward+backward only accumulate gradients
  /// locally; the first synchronised backward after it reduces the accumulated sum.
  /// Example: { auto guard = dmodel->no_sync(); dmodel(x1)... .backward(); }
  NoSyncGuard no_sync();

  /// Marks a span of user code on this model's trace (see ddp/parallel/trace.h).
  trace::Scope trace_scope(std::string name) const;

  /// Runs `body` (this rank's training loop) so that ranks with fewer batches keep the
  /// others going: ddp::join({this}, body, options). See ddp/parallel/join.h and docs/join.md.
  /// Example: dmodel->join([&] { for (auto& b : batches) { ...; loss.backward(); } });
  void join(const std::function<void()>& body, const JoinOptions& options = JoinOptions());

  // Joinable (called by ddp::join).
  ProcessGroup& join_process_group() const override;
  void join_enter(std::shared_ptr<detail::JoinContext> context, bool notifier) override;
  void join_leave() noexcept override;
  void join_shadow(const JoinRound& round) override;
  void join_finish(int src) override;

 protected:
  DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                              DistributedDataParallelOptions options);

  /// Runs before the wrapped forward: reports an unfinished or failed previous
  /// reduction and parameters changed since construction, rebuilds buckets once,
  /// broadcasts buffers. Returns whether after_forward wants the output's tensors (to
  /// find unused parameters, or the end of the first static_graph backward).
  bool before_forward();
  /// Runs after it: arms the gradient hooks for one reduced backward (or for local
  /// accumulation under no_sync). `output_type` names an output type DDP cannot search
  /// for tensors, or is nullptr.
  void after_forward(const std::vector<at::Tensor>& outputs, const char* output_type);

 private:
  friend class NoSyncGuard;
  friend class trace::Scope;
  std::shared_ptr<detail::TraceWriter> trace_writer() const;

  struct State;
  std::unique_ptr<State> state_;
};

namespace detail {
template <typename M>
std::shared_ptr<torch::nn::Module> as_module_ptr(const torch::nn::ModuleHolder<M>& holder) {
  TORCH_CHECK(!holder.is_empty(), "DistributedDataParallel got an empty module holder "
                                  "(nullptr); construct the module before wrapping it.");
  return holder.ptr();
}
template <typename M>
std::shared_ptr<torch::nn::Module> as_module_ptr(const std::shared_ptr<M>& module) {
  TORCH_CHECK(module != nullptr, "DistributedDataParallel got a null module pointer; "
                                 "construct the module before wrapping it.");
  return module;
}
}  // namespace detail

/// The module behind ddp::DistributedDataParallel<ModuleType>. ModuleType is what you
/// wrap: a TORCH_MODULE holder (Net, torch::nn::Sequential, ...) or a
/// std::shared_ptr to a torch::nn::Module subclass.
template <typename ModuleType>
class DistributedDataParallelImpl : public DistributedDataParallelBase {
 public:
  explicit DistributedDataParallelImpl(
      ModuleType module, DistributedDataParallelOptions options = DistributedDataParallelOptions())
      : DistributedDataParallelBase(detail::as_module_ptr(module), std::move(options)),
        module_(std::move(module)) {}

  /// The wrapped module, e.g. for torch::save(dmodel->module(), path).
  ModuleType& module() { return module_; }
  const ModuleType& module() const { return module_; }

  /// Calls the wrapped module's forward with any arguments and returns its output.
  template <typename... Args>
  auto forward(Args&&... args) {
    using Output = std::decay_t<decltype(module_->forward(std::forward<Args>(args)...))>;
    const bool wants_outputs = before_forward();
    Output output = module_->forward(std::forward<Args>(args)...);
    if (wants_outputs) {
      std::vector<at::Tensor> tensors;
      OutputTensors<Output>::collect(output, tensors);
      after_forward(tensors, OutputTensors<Output>::known ? nullptr : typeid(Output).name());
    } else {
      after_forward({}, nullptr);
    }
    return output;
  }

 private:
  ModuleType module_;
};

/// A ModuleHolder over DistributedDataParallelImpl: dmodel->forward(x), dmodel(x),
/// dmodel->module(), dmodel->parameters(). Class template argument deduction picks
/// ModuleType from the first argument:
///   auto dmodel = ddp::DistributedDataParallel(model, options);  // ...<Net>
template <typename ModuleType>
class DistributedDataParallel
    : public torch::nn::ModuleHolder<DistributedDataParallelImpl<ModuleType>> {
  using Holder = torch::nn::ModuleHolder<DistributedDataParallelImpl<ModuleType>>;

 public:
  /* implicit */ DistributedDataParallel(std::nullptr_t) : Holder(nullptr) {}
  /* implicit */ DistributedDataParallel(
      std::shared_ptr<DistributedDataParallelImpl<ModuleType>> impl)
      : Holder(std::move(impl)) {}
  /// Verifies the model across ranks, broadcasts rank 0's parameters and buffers, and
  /// installs the gradient hooks. Collective: every rank of the group must call it.
  /// Throws MismatchError when ranks' models differ, TimeoutError when a rank does not
  /// take part in time.
  DistributedDataParallel(ModuleType module,
                          DistributedDataParallelOptions options = DistributedDataParallelOptions())
      : Holder(std::make_shared<DistributedDataParallelImpl<ModuleType>>(std::move(module),
                                                                         std::move(options))) {}

  /// dmodel(args...) is dmodel->forward(args...). (ModuleHolder's own operator() cannot
  /// see a templated forward, so it is replaced here.)
  template <typename... Args>
  auto operator()(Args&&... args) {
    return this->get()->forward(std::forward<Args>(args)...);
  }
};

template <typename ModuleType>
DistributedDataParallel(ModuleType, DistributedDataParallelOptions)
    -> DistributedDataParallel<ModuleType>;
template <typename ModuleType>
DistributedDataParallel(ModuleType) -> DistributedDataParallel<ModuleType>;

/// While alive, the model accumulates gradients locally: forwards run under it are not
/// reduced in their backward. Nests. Get one from dmodel->no_sync().
class NoSyncGuard {
 public:
  explicit NoSyncGuard(DistributedDataParallelBase& model);
  ~NoSyncGuard();
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  DistributedDataParallelBase* model_;
};

}  // namespace ddp
