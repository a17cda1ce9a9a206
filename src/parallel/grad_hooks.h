#pragma once

// One post hook per parameter's gradient accumulator: "this parameter's gradient is
// ready". The hooks are removed again when this object dies.
//
// Note [Holding gradient accumulators]
// A leaf tensor keeps only a weak reference to its AccumulateGrad node; the graph
// built by each forward holds the strong ones. Between iterations nothing does, the
// node would die, and the next forward would create a fresh one without our hook.
// So the accumulators are held here for DDP's lifetime, as c10d's reducer does.

#include "distributed/common/compat.h"

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace torch {
namespace autograd {
struct Node;
}  // namespace autograd
}  // namespace torch

namespace ddp {
namespace detail {

class GradHooks {
 public:
  using OnReady = std::function<void(size_t index)>;

  /// Registers a hook on params[i]'s accumulator that calls on_ready(i) after the
  /// gradient has been accumulated into params[i].grad(). The params must be leaves
  /// that require grad.
  GradHooks(const std::vector<at::Tensor>& params, OnReady on_ready);
  ~GradHooks();
  GradHooks(const GradHooks&) = delete;
  GradHooks& operator=(const GradHooks&) = delete;

  /// accumulators()[i] is params[i]'s AccumulateGrad node.
  const std::vector<NodePtr>& accumulators() const { return accumulators_; }

  /// Whether params[i] still uses the accumulator hooked here. Changing a parameter's
  /// dtype or device (module->to(...), set_data) gives it a new accumulator, and the
  /// gradients of later backward passes would bypass the hook.
  bool hooked(const at::Tensor& param, size_t i) const;

 private:
  std::vector<NodePtr> accumulators_;
  std::vector<uintptr_t> keys_;
};

/// Told when backward reaches an output of a forward.
class OutputListener {
 public:
  virtual ~OutputListener() = default;
  virtual void on_output_grad(uint64_t forward_id) = 0;
};

/// Calls listener->on_output_grad(forward_id) from a pre-hook on the grad_fn of each of
/// `outputs` that has one, i.e. when backward first reaches them (a listener that no
/// longer exists is skipped).
void hook_output_nodes(const std::vector<at::Tensor>& outputs,
                       const std::weak_ptr<OutputListener>& listener, uint64_t forward_id);

}  // namespace detail
}  // namespace ddp
