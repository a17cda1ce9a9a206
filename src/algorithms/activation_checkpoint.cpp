// ddp::checkpoint's core: the autograd node that stands for a checkpointed function, its
// forward (run fn, find where fn's graph meets the rest, drop fn's graph) and its backward
// (recompute fn, differentiate it, hand the gradients on).
//
// Note [Checkpoint without saved-tensor hooks]
// PyTorch's non-reentrant checkpoint keeps fn's autograd graph and replaces each tensor
// that graph saves by a handle (saved-tensor hooks), refilled by a recompute when
// backward first needs one. LibTorch's saved-tensor hooks are Python objects, so here the
// graph itself is replaced:
//   forward   fn runs with gradients on, on detached copies of its tensor arguments.
//             The nodes this thread created meanwhile (sequence numbers from before to
//             after fn) are fn's graph; walking it from the outputs finds its boundary:
//             the accumulators of the argument copies and of every leaf fn used (its
//             parameters, found, not declared). Then fn's graph is dropped with its
//             activations, and one node, CheckpointBackward, takes its place: the outputs
//             are detached aliases whose gradient function it is, and its next edges are
//             the arguments' own gradient edges and the leaves' accumulators. So the rest
//             of the graph sees the parameters through this node, as it would see them
//             through fn's graph: DDP's accumulator hooks, find_unused_parameters (which
//             walks next edges), static_graph and fully_shard's gradients work unchanged.
//   backward  the node restores the forward's RNG state (forked: the program's streams do
//             not advance) and autocast state, calls fn again with gradients on, on fresh
//             detached copies of the saved arguments, checks that the recompute met the
//             same boundary, and differentiates it in a nested engine pass that captures
//             the gradients at that boundary (torch::autograd::grad's way: no
//             AccumulateGrad runs inside), which it returns to its next edges.
// What the node keeps from forward to backward: the arguments (detached aliases, as
// PyTorch keeps its inputs), fn and its copied non-tensor arguments, the boundary (the
// accumulators and the parameters they belong to, which the model holds anyway), the RNG
// state (about 5 KB for the CPU, 16 bytes per CUDA device) and the autocast flags. Not
// kept: every tensor fn's graph saved. Against PyTorch's memory:
//   - during the forward, fn's saved activations live until fn returns (one checkpointed
//     region's worth at a time, the same as the recompute holds in backward); PyTorch's
//     live only while fn references them;
//   - backward recomputes all of fn and differentiates it in one nested pass: one
//     region's activations at a time, as PyTorch at its peak (PyTorch can stop the
//     recompute early once the saved tensors it needs are back);
//   - the nested pass hands all of the region's gradients on at its end, not one by one:
//     DDP's buckets fill per region, and the region's parameter gradients exist together
//     for a moment (as large as the region's parameters) before they are accumulated.
// What it refuses: a tensor that requires grad, computed outside fn and captured by it
// (its gradient would have to cross the boundary through a node of the outer graph,
// which the nested pass would run too: pass it as an argument), and create_graph.
//
// Note [Tensor hooks run once]
// LibTorch 2.x runs a leaf's tensor hooks (param.register_hook) when a gradient is
// captured at its accumulator, as torch.autograd.grad does; the captured gradient then
// reaches the same accumulator in the outer backward, which runs them again. So the
// nested pass runs with the hooks of the captured accumulators set aside: they run once,
// in the outer backward, as without the checkpoint. LibTorch 1.13 runs no hooks on a
// capture.
//
// Note [Autocast cache in a checkpoint]
// Autocast caches the low-precision copy of each weight for the rest of the region. A
// copy cast before fn would reach fn's graph as a tensor computed outside it, while the
// recompute (in a region of its own) casts the weight itself. So fn and its recompute
// start with an empty cache when autocast is on: each casts the weights it uses, and the
// two graphs meet the same boundary. The casts are the same values, so only weights used
// both before fn and after it in one region are cast once more.

#include <ddp/algorithms/activation_checkpoint.h>

#include "distributed/common/check.h"
#include "distributed/common/compat.h"
#include "algorithms/checkpoint_state.h"
#include "modules/param_owners.h"

#include <ATen/SequenceNumber.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <c10/util/irange.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <optional>
#include <set>
#include <type_traits>
#include <unordered_set>

namespace ddp {
namespace detail {

namespace {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

thread_local int checkpoint_depth = 0;

/// Marks this thread as inside a checkpointed function (check_outside_checkpoint).
struct DepthGuard {
  DepthGuard() { ++checkpoint_depth; }
  ~DepthGuard() { --checkpoint_depth; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

template <typename T, typename... A>
NodePtr make_node(A&&... args) {
  if constexpr (std::is_same<NodePtr, std::shared_ptr<Node>>::value) {
    return std::make_shared<T>(std::forward<A>(args)...);  // LibTorch 1.13
  } else {
    return c10::make_intrusive<T>(std::forward<A>(args)...);
  }
}

std::string dtype_and_shape(const at::Tensor& t) { return c10::str(t.scalar_type(), t.sizes()); }

/// A fresh leaf with `saved`'s data, requiring grad as the argument did.
at::Tensor fresh_leaf(const at::Tensor& saved, bool requires_grad) {
  if (!saved.defined()) return saved;
  at::Tensor x = saved.detach();
  if (requires_grad) x.requires_grad_(true);
  return x;
}

/// Where fn's graph meets what existed before fn: argument `input`'s fresh copy, or a
/// leaf that fn used (a parameter).
struct Boundary {
  int64_t input = -1;  // >= 0: the argument's index
  at::Tensor leaf;     // otherwise the leaf
  int64_t version = 0;
};

/// The edges that leave fn's part of the graph behind `outputs`: the nodes that thread
/// `thread` created with sequence numbers in [start, end) (Note [Checkpoint without
/// saved-tensor hooks]).
edge_list boundary_edges(const std::vector<at::Tensor>& outputs, uint64_t thread, uint64_t start,
                         uint64_t end) {
  auto inside = [&](const Node* n) {
    return n->thread_id() == thread && n->sequence_nr() >= start && n->sequence_nr() < end;
  };
  std::unordered_set<const Node*> seen;
  std::set<std::pair<const Node*, uint32_t>> seen_edges;
  std::vector<Node*> stack;
  edge_list found;
  auto visit = [&](const Edge& e) {
    if (!e.is_valid()) return;
    Node* n = e.function.get();
    if (inside(n)) {
      if (seen.insert(n).second) stack.push_back(n);
    } else if (seen_edges.insert({n, e.input_nr}).second) {
      found.push_back(e);
    }
  };
  for (const at::Tensor& t : outputs) {
    if (t.defined() && t.requires_grad()) visit(torch::autograd::impl::gradient_edge(t));
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) visit(e);
  }
  return found;
}

/// Sorts boundary edges into arguments and leaves; refuses any other (a captured tensor
/// computed outside fn).
std::vector<Boundary> classify(const edge_list& edges, const std::vector<at::Tensor>& xs,
                               const std::string& what, const char* when) {
  std::vector<Boundary> out;
  for (const Edge& e : edges) {
    auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(e.function.get());
    DDP_CHECK(acc != nullptr, what, ": ", when,
              " uses a tensor that requires grad and was computed outside the checkpointed "
              "function (its gradient function is ",
              e.function->name(),
              ") without receiving it as an argument. Its gradient cannot flow through the "
              "recompute: pass the tensor to ddp::checkpoint as an argument, e.g. "
              "ddp::checkpoint(fn, x, that_tensor), instead of capturing it.");
    const at::Tensor& var = acc->variable;
    Boundary b;
    for (const auto i : c10::irange(xs.size())) {
      if (xs[i].defined() && xs[i].unsafeGetTensorImpl() == var.unsafeGetTensorImpl()) {
        b.input = static_cast<int64_t>(i);
      }
    }
    if (b.input < 0) {
      b.leaf = var;
      b.version = var._version();
    }
    out.push_back(std::move(b));
  }
  return out;
}

/// Refuses a leaf of a fully_shard unit whose parameters are sharded now: the unit's
/// forward ran inside fn (the checkpoint is around the unit, not inside it).
void check_units(const std::vector<Boundary>& boundary, const std::string& what, const char* when) {
  for (const Boundary& b : boundary) {
    if (b.input >= 0) continue;
    const ShardOwner* unit = shard_owner_of(b.leaf);
    DDP_CHECK(unit == nullptr || unit->unsharded(), what, ": ", when, " uses a parameter (",
              dtype_and_shape(b.leaf), ") of the fully_shard unit ", unit->name(),
              ", whose parameters are sharded at this point: the checkpointed function runs "
              "the unit's forward, so the checkpoint is around the unit. A unit's "
              "all-gathers and reduce-scatters are driven by its own autograd graph, which a "
              "checkpoint drops and recomputes; put the checkpoint inside the unit: wrap the "
              "block first and shard the wrapper (ddp::apply_activation_checkpointing<Block>"
              "(model) or ddp::checkpoint_wrapper(block), then ddp::fully_shard on it), or "
              "call ddp::checkpoint inside the block's forward.");
  }
}

/// Note [Tensor hooks run once]: sets the tensor hooks of the capture points aside for
/// the nested pass (LibTorch 2.x; nothing in 1.13, which has no tensor_pre_hooks()).
template <typename N, typename = void>
struct TensorHooks {
  struct Saved {};
  static void take(N*, Saved&) {}
  static void put_back(N*, Saved&) {}
};
template <typename N>
struct TensorHooks<N, std::void_t<decltype(std::declval<N&>().tensor_pre_hooks()),
                                  decltype(std::declval<N&>().retains_grad_hooks())>> {
  struct Saved {
    std::decay_t<decltype(std::declval<N&>().tensor_pre_hooks())> pre;
    std::decay_t<decltype(std::declval<N&>().retains_grad_hooks())> retains;
  };
  static void take(N* n, Saved& s) {
    std::swap(s.pre, n->tensor_pre_hooks());
    std::swap(s.retains, n->retains_grad_hooks());
  }
  static void put_back(N* n, Saved& s) { take(n, s); }
};

template <typename N>
class HookStash {
 public:
  explicit HookStash(const edge_list& edges) {
    std::unordered_set<N*> seen;
    for (const Edge& e : edges) {
      N* n = e.function.get();
      if (!seen.insert(n).second) continue;
      saved_.emplace_back(n, typename TensorHooks<N>::Saved());
      TensorHooks<N>::take(n, saved_.back().second);
    }
  }
  ~HookStash() {
    for (auto& s : saved_) TensorHooks<N>::put_back(s.first, s.second);
  }
  HookStash(const HookStash&) = delete;
  HookStash& operator=(const HookStash&) = delete;

 private:
  std::vector<std::pair<N*, typename TensorHooks<N>::Saved>> saved_;
};

/// One output tensor of fn.
struct OutputSlot {
  bool differentiable = false;  // it has an edge to the node (input `input_nr` of it)
  uint32_t input_nr = 0;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes;
  c10::Device device = c10::Device(c10::kCPU);
};

class CheckpointBackward final : public Node {
 public:
  explicit CheckpointBackward(edge_list&& next) : Node(std::move(next)) {}

  std::string name() const override { return "ddp::CheckpointBackward"; }
  void release_variables() override {
    fn = nullptr;
    saved_inputs.clear();
    released = true;
  }
  variable_list apply(variable_list&& grads) override;

  std::string what;
  ActivationCheckpointOptions options;
  CheckpointFunction fn;
  std::vector<at::Tensor> saved_inputs;  // detached aliases of the arguments
  std::vector<int64_t> input_versions;
  std::vector<bool> input_requires_grad;
  RngState rng;
  AutocastState autocast;
  std::vector<Boundary> boundary;  // one per next edge
  std::vector<OutputSlot> outputs;
  bool released = false;

 private:
  void check_versions() const;
  std::vector<at::Tensor> recompute(std::vector<at::Tensor>& xs, uint64_t& thread, uint64_t& start,
                                    uint64_t& end);
  void check_recompute(const std::vector<at::Tensor>& outs,
                       const std::vector<Boundary>& again) const;
};

void CheckpointBackward::check_versions() const {
  for (const auto i : c10::irange(saved_inputs.size())) {
    const at::Tensor& x = saved_inputs[i];
    DDP_CHECK(!x.defined() || x._version() == input_versions[i], what, ": argument ", i, " (",
              dtype_and_shape(x),
              ") was modified in place between the checkpointed forward and its backward "
              "(version ",
              input_versions[i], " then, ", x._version(),
              " now), so the recompute would see other values than the forward did. Modify "
              "a copy (x.clone()), or modify it after backward.");
  }
  for (const Boundary& b : boundary) {
    if (b.input >= 0) continue;
    DDP_CHECK(b.leaf._version() == b.version, what, ": a parameter it uses (",
              dtype_and_shape(b.leaf),
              ") was modified in place between the checkpointed forward and its backward "
              "(version ",
              b.version, " then, ", b.leaf._version(),
              " now; optimizer.step() before backward()?), so the recompute would see other "
              "values than the forward did. Step the optimizer after backward.");
  }
}

std::vector<at::Tensor> CheckpointBackward::recompute(std::vector<at::Tensor>& xs, uint64_t& thread,
                                                      uint64_t& start, uint64_t& end) {
  std::optional<RngFork> fork;
  if (options.preserve_rng_state()) fork.emplace(rng);
  AutocastScope autocast_scope(autocast);
  clear_autocast_cache_if_enabled();  // Note [Autocast cache in a checkpoint]
  at::AutoGradMode grad_mode(true);
  DepthGuard depth;
  xs.clear();
  for (const auto i : c10::irange(saved_inputs.size())) {
    xs.push_back(fresh_leaf(saved_inputs[i], input_requires_grad[i]));
  }
  thread = at::RecordFunction::currentThreadId();
  start = at::sequence_number::peek();
  std::vector<at::Tensor> outs = fn(xs);
  end = at::sequence_number::peek();
  return outs;
}

void CheckpointBackward::check_recompute(const std::vector<at::Tensor>& outs,
                                         const std::vector<Boundary>& again) const {
  const char* fix =
      " The checkpointed function must compute the same thing each time it is called: the "
      "same control flow, the "
      "same parameters, no tensors with requires_grad created inside it, nothing that "
      "depends on state changed since the forward.";
  DDP_CHECK(outs.size() == outputs.size(), what, ": the recompute in backward returned ",
            outs.size(), " tensor(s), the forward ", outputs.size(), ".", fix);
  for (const auto k : c10::irange(outs.size())) {
    const OutputSlot& slot = outputs[k];
    if (!slot.differentiable) continue;
    const at::Tensor& o = outs[k];
    DDP_CHECK(o.defined() && o.requires_grad() && o.scalar_type() == slot.dtype &&
                  o.sizes().vec() == slot.sizes && o.device() == slot.device,
              what, ": output ", k, " of the recompute in backward is ",
              o.defined() ? dtype_and_shape(o) + (o.requires_grad() ? "" : " without grad")
                          : std::string("undefined"),
              ", in the forward it was ", slot.dtype, at::IntArrayRef(slot.sizes), " on ",
              slot.device, ".", fix);
  }
  std::set<const void*> before, after;
  for (const Boundary& b : boundary) {
    before.insert(b.input >= 0 ? reinterpret_cast<const void*>(b.input + 1)
                               : b.leaf.unsafeGetTensorImpl());
  }
  for (const Boundary& b : again) {
    after.insert(b.input >= 0 ? reinterpret_cast<const void*>(b.input + 1)
                              : b.leaf.unsafeGetTensorImpl());
  }
  DDP_CHECK(before == after, what, ": the recompute in backward used ", after.size(),
            " argument(s) and parameter(s) with gradients, the forward ", before.size(),
            ", not the same ones.", fix);
}

variable_list CheckpointBackward::apply(variable_list&& grads) {
  DDP_CHECK(!released, what,
            ": backward ran through this checkpoint a second time, but the first backward "
            "freed what its recompute needs (the saved arguments). To run backward twice "
            "through the same forward, call the first one with retain_graph=true "
            "(loss.backward({}, /*retain_graph=*/true)).");
  DDP_CHECK(!at::GradMode::is_enabled(), what,
            ": backward with create_graph=true (double backward) is not supported through a "
            "checkpoint: the recomputed graph starts from detached copies of the arguments. "
            "Call the function without ddp::checkpoint where second derivatives are needed.");
  check_versions();
  check_units(boundary, what, "the recompute");

  std::vector<at::Tensor> xs;
  uint64_t thread = 0, start = 0, end = 0;
  std::vector<at::Tensor> outs = recompute(xs, thread, start, end);
  check_recompute(outs, classify(boundary_edges(outs, thread, start, end), xs, what,
                                 "the recompute in backward"));

  edge_list roots;
  variable_list root_grads;
  for (const auto k : c10::irange(outs.size())) {
    const OutputSlot& slot = outputs[k];
    if (!slot.differentiable || !grads[slot.input_nr].defined()) continue;
    roots.push_back(torch::autograd::impl::gradient_edge(outs[k]));
    root_grads.push_back(std::move(grads[slot.input_nr]));
  }
  variable_list result(num_outputs());
  if (roots.empty()) return result;
  edge_list capture;
  for (const Boundary& b : boundary) {
    capture.push_back(torch::autograd::impl::gradient_edge(b.input >= 0 ? xs[b.input] : b.leaf));
  }
  HookStash<Node> stash(capture);  // Note [Tensor hooks run once]
  result =
      torch::autograd::Engine::get_default_engine().execute(roots, root_grads, /*keep_graph=*/false,
                                                            /*create_graph=*/false,
                                                            /*accumulate_grad=*/false, capture);
  return result;
}

}  // namespace

void check_outside_checkpoint(const std::string& what, const std::string& fix) {
  DDP_CHECK(checkpoint_depth == 0, what,
            ": its forward ran inside a function that ddp::checkpoint (or a "
            "ddp::CheckpointWrapper) checkpoints. Its hooks on the autograd graph would be "
            "dropped with that function's graph, and its forward run again in backward. ",
            fix);
}

std::vector<at::Tensor> checkpoint_tensors(const ActivationCheckpointOptions& options,
                                           CheckpointFunction fn, std::vector<at::Tensor> inputs,
                                           const std::string& what) {
  DDP_CHECK(fn, what, ": got an empty function.");
  if (!at::GradMode::is_enabled()) return fn(std::move(inputs));  // nothing to recompute

  const size_t n = inputs.size();
  std::vector<at::Tensor> saved(n), xs(n);
  std::vector<int64_t> versions(n, 0);
  std::vector<bool> requires_grad(n, false);
  for (const auto i : c10::irange(n)) {
    if (!inputs[i].defined()) continue;
    saved[i] = inputs[i].detach();
    versions[i] = inputs[i]._version();
    requires_grad[i] = inputs[i].requires_grad();
    xs[i] = fresh_leaf(saved[i], requires_grad[i]);
  }
  RngState rng;
  if (options.preserve_rng_state()) rng = capture_rng(inputs);
  const AutocastState autocast = capture_autocast();

  const uint64_t thread = at::RecordFunction::currentThreadId();
  uint64_t start = 0, end = 0;
  std::vector<at::Tensor> outs;
  {
    DepthGuard depth;
    clear_autocast_cache_if_enabled();  // Note [Autocast cache in a checkpoint]
    start = at::sequence_number::peek();
    outs = fn(xs);
    end = at::sequence_number::peek();
  }
  for (const auto i : c10::irange(n)) {
    DDP_CHECK(!saved[i].defined() || saved[i]._version() == versions[i], what,
              ": the checkpointed function modified its argument ", i, " (",
              dtype_and_shape(saved[i]),
              ") in place. Backward calls the function again on its arguments, so it must "
              "leave them as they were: modify a copy (x.clone()) instead.");
  }
  DDP_CHECK(!outs.empty(), what,
            ": the checkpointed function returned no tensor. Return the tensor(s) whose "
            "gradients should flow back (at::Tensor, std::vector<at::Tensor>, or a tuple of "
            "them).");
  const bool any_grad = std::any_of(outs.begin(), outs.end(), [](const at::Tensor& t) {
    return t.defined() && t.requires_grad();
  });
  // Nothing to differentiate (no argument or parameter needs a gradient): returned as
  // they are, as PyTorch does, and nothing is kept for a recompute.
  if (!any_grad) return outs;

  std::vector<Boundary> boundary =
      classify(boundary_edges(outs, thread, start, end), xs, what, "the checkpointed function");
  check_units(boundary, what, "the checkpointed function");

  edge_list next;
  for (const Boundary& b : boundary) {
    next.push_back(torch::autograd::impl::gradient_edge(b.input >= 0 ? inputs[b.input] : b.leaf));
  }
  NodePtr node = make_node<CheckpointBackward>(std::move(next));
  auto* self = static_cast<CheckpointBackward*>(node.get());
  self->what = what;
  self->options = options;
  self->fn = std::move(fn);
  self->saved_inputs = std::move(saved);
  self->input_versions = std::move(versions);
  self->input_requires_grad = std::move(requires_grad);
  self->rng = std::move(rng);
  self->autocast = autocast;
  self->boundary = std::move(boundary);

  std::vector<at::Tensor> result;
  result.reserve(outs.size());
  for (at::Tensor& o : outs) {
    OutputSlot slot;
    if (o.defined() && o.requires_grad()) {
      at::Tensor r = o.detach();
      torch::autograd::create_gradient_edge(r, node);
      slot.differentiable = true;
      slot.input_nr = static_cast<uint32_t>(torch::autograd::impl::gradient_edge(r).input_nr);
      slot.dtype = r.scalar_type();
      slot.sizes = r.sizes().vec();
      slot.device = r.device();
      result.push_back(std::move(r));
    } else {
      result.push_back(std::move(o));
    }
    self->outputs.push_back(std::move(slot));
  }
  return result;  // fn's graph goes with `outs`
}

}  // namespace detail
}  // namespace ddp
