// ddp::fully_shard: the units, their place in the tree, and FSDP2's schedule.
//
// Note [The fully_shard schedule]
// A step starts at the root's forward (the root: the first unit whose forward runs; its
// tree is every unit inside it). Per unit, with N ranks:
//   forward:  wait for its all-gather (launched now, or prefetched by the unit before
//             it), launch the next unit's (last step's order), run the module, then
//             free the full parameters unless reshard_after_forward is off (the root).
//   backward: an identity autograd function on the unit's outputs runs first: it
//             all-gathers the unit again and launches the all-gather of the unit that
//             ran forward before it; the first one of a backward also sets every
//             sharded gradient aside (so that AccumulateGrad sees empty full-size
//             .grad()s) and queues the end-of-backward callback. An identity function
//             on the unit's inputs runs after the unit's gradients are accumulated:
//             it waits for the previous unit's reduce-scatter (Note [One
//             reduce-scatter in flight]), launches this unit's and frees the full
//             parameters.
//   end:      the callback runs the reduce-scatter of units whose inputs need no
//             gradient (the first block, the root), in reverse forward order, then
//             waits for every reduce-scatter and adds the sharded gradients to .grad().
// Every rank runs the same forwards and backwards, so every rank issues the same
// collectives in the same order. A forward without gradients (eval, NoGradGuard) frees
// every unit after it, the root too: nothing will need them.

#include <ddp/fsdp/fully_shard.h>

#include <ddp/distributed/memory.h>
#include <ddp/errors.h>

#include "distributed/common/check.h"
#include "algorithms/join_context.h"
#include "modules/module_tree.h"
#include "fsdp/shard_unit.h"

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace ddp {
namespace detail {

struct RootStep {
  std::vector<ShardUnit*> units;  // the root's tree, the root first
  std::vector<ShardUnit*> forward_order;
  std::vector<ShardUnit*> last_forward_order;
  bool active = false;
  bool training = false;
  bool backward_started = false;
  // The unit whose reduce-scatter was launched last and not yet waited for.
  ShardUnit* reducing = nullptr;
  // HSDP: the unit before it, whose all-reduce across replicas is in flight.
  ShardUnit* all_reducing = nullptr;
  // A forward without gradients while a training forward waits for its backward (an
  // evaluation in between): it leaves the step's state alone.
  bool side = false;
  std::shared_ptr<std::atomic<int>> live_graphs = std::make_shared<std::atomic<int>>(0);
};

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch::nn::Module;

// ---- the registry: which module has a unit --------------------------------------

// Note [Who keeps a unit alive]
// FSDP2's fully_shard changes a module in place, and programs ignore what it returns
// for the blocks. Here the unit is an object of its own, so the registry keeps it alive
// (`keep`) until the tree holds it: until fully_shard of a module around it puts it in
// its module's place, or, for the root, until its first forward (whose caller holds it).
struct Registered {
  std::weak_ptr<FullyShardBase> unit;
  std::shared_ptr<FullyShardBase> keep;
  std::function<torch::nn::AnyModule()> as_any;
};
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<const Module*, Registered>& registry() {
  static std::unordered_map<const Module*, Registered> map;
  return map;
}

std::shared_ptr<FullyShardBase> registered_unit(const Module* m, Registered* out = nullptr) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(m);
  if (it == registry().end()) return nullptr;
  auto unit = it->second.unit.lock();
  if (!unit) {
    registry().erase(it);
    return nullptr;
  }
  if (out) *out = it->second;
  return unit;
}

void release_keep(const Module* m) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(m);
  if (it != registry().end()) it->second.keep.reset();
}

// ---- autograd: the identity functions around a unit ------------------------------

struct UnitRef : torch::CustomClassHolder {
  UnitRef(ShardUnit* unit, std::shared_ptr<std::atomic<int>> live)
      : unit(unit), live(std::move(live)) {
    ++*this->live;
  }
  ~UnitRef() override { --*live; }
  ShardUnit* unit;
  std::shared_ptr<std::atomic<int>> live;
};

ShardUnit* unit_from(AutogradContext* ctx) {
  auto ref = ctx->saved_data.at("unit").toCapsule();
  return static_cast<UnitRef*>(ref.get())->unit;
}

void post_backward(ShardUnit& u);
void pre_backward(ShardUnit& u);

/// An identity autograd function whose backward calls Hook on its unit: on a unit's
/// outputs pre_backward, on its inputs post_backward.
template <void (*Hook)(ShardUnit&)>
struct UnitHook : torch::autograd::Function<UnitHook<Hook>> {
  // A TensorList, not a variable_list: Function::apply counts only a TensorList's
  // elements as inputs that take part in autograd.
  static variable_list forward(AutogradContext* ctx, at::TensorList xs, c10::IValue ref) {
    ctx->saved_data["unit"] = std::move(ref);
    return xs.vec();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Hook(*unit_from(ctx));
    grads.emplace_back();  // for `ref`
    return grads;
  }
};
using PreBackward = UnitHook<&pre_backward>;
using PostBackward = UnitHook<&post_backward>;

RootStep& step_of(ShardUnit& u) {
  TORCH_INTERNAL_ASSERT(u.schedule.root && u.schedule.root->schedule.step);
  return *u.schedule.root->schedule.step;
}

bool effective_reshard(const ShardUnit& u) {
  return u.options().reshard_after_forward() && !u.schedule.is_root;
}

void end_step(RootStep& st) {
  for (ShardUnit* u : st.units) {
    u->reshard();
    u->schedule.ran_forward = false;
  }
  st.active = false;
}

void finish_backward(ShardUnit* root) {
  RootStep& st = *root->schedule.step;
  std::vector<ShardUnit*> order;
  std::unordered_set<ShardUnit*> seen;
  for (ShardUnit* u : st.forward_order) {
    if (seen.insert(u).second) order.push_back(u);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (!(*it)->schedule.post_backward_done) post_backward(**it);
  }
  for (ShardUnit* u : order) u->finish_reduce();
  st.reducing = nullptr;
  st.all_reducing = nullptr;
  st.last_forward_order = order;
  end_step(st);
}

void pre_backward(ShardUnit& u) {
  RootStep& st = step_of(u);
  if (!st.backward_started) {
    st.backward_started = true;
    for (ShardUnit* v : st.units) {
      if (v->schedule.ran_forward) v->stash_grads();
    }
    ShardUnit* root = u.schedule.root;
    torch::autograd::Engine::get_default_engine().queue_callback([root] { finish_backward(root); });
  }
  u.finish_unshard();
  // Prefetch: the unit that ran forward before this one runs backward next.
  const auto& order = st.forward_order;
  auto it = std::find(order.rbegin(), order.rend(), &u);
  if (it != order.rend() && std::next(it) != order.rend()) {
    ShardUnit* prev = *std::next(it);
    if (!prev->schedule.post_backward_done) prev->start_unshard();
  }
}

void post_backward(ShardUnit& u) {
  if (u.schedule.post_backward_done) return;
  u.schedule.post_backward_done = true;
  // Note [One reduce-scatter in flight]: the previous unit's reduce-scatter, launched
  // one unit's backward ago, is waited for before this one is launched, and its input
  // freed, as FSDP2 does. So one unit's reduce-scatter buffer is alive at a time, not
  // every unit's until the end of backward.
  // With HSDP, a unit's all-reduce runs one unit's backward longer (Note [The replicas'
  // all-reduce overlaps]): two units' buffers are alive then.
  RootStep& st = step_of(u);
  if (st.all_reducing && st.all_reducing != &u) st.all_reducing->finish_reduce();
  st.all_reducing = nullptr;
  if (st.reducing && st.reducing != &u) {
    st.reducing->advance_reduce();
    if (st.reducing->reduce_pending()) st.all_reducing = st.reducing;
  }
  st.reducing = nullptr;
  u.reduce_grads(u.schedule.requires_gradient_sync);
  if (u.reduce_pending()) st.reducing = &u;
  u.reshard();
}

}  // namespace

// Note [fully_shard turns on the caching CPU allocator]
// A sharded step on the CPU allocates the same large tensors every step (a unit's full
// gradients, the optimizer's temporaries) between persistent ones (the shards, their
// gradients, the optimizer's state). Served by glibc, they fragment its heap, and what
// it then holds free varies run to run by hundreds of MB (bench/run-fsdp: a peak RSS
// of 1.02 to 1.31 GB for the same job), taking back what sharding saved. So the first
// fully_shard on a CPU group turns on ddp::enable_cpu_caching_allocator (Note [The
// caching CPU allocator]), as a GPU's caching allocator serves FSDP2 there: measured, a
// steady 0.96 GB and no slower. DDP_CPU_CACHING_ALLOCATOR=0 leaves glibc in charge.
void default_cpu_caching_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("DDP_CPU_CACHING_ALLOCATOR");
    if (env && std::string(env) == "0") return;
    enable_cpu_caching_allocator();
  });
}

namespace {

/// The root's first forward: its tree of units.
void lazy_init_root(ShardUnit& root) {
  auto st = std::make_shared<RootStep>();
  st->units.push_back(&root);
  root.schedule.root = &root;
  root.schedule.is_root = true;
  root.set_path("");
  for (const auto& item : root.schedule.wrapper->named_modules("", /*include_self=*/false)) {
    auto* w = dynamic_cast<FullyShardBase*>(item.value().get());
    if (!w || !w->is_sharded()) continue;
    ShardUnit& u = w->unit();
    if (u.schedule.root != &root) u.set_path(item.key());
    if (u.schedule.root == &root) continue;
    DDP_CHECK(!(u.schedule.step && u.schedule.step->active), "ddp::fully_shard: unit ", u.name(),
              " ran a forward of its own as a root, and its "
              "step is not over, when the unit around it (",
              root.name(), ") ran its first forward. Call the model's root unit, not its blocks.");
    u.schedule.root = &root;
    u.schedule.is_root = false;
    u.schedule.step.reset();
    st->units.push_back(&u);
  }
  root.schedule.step = std::move(st);
  release_keep(static_cast<FullyShardBase*>(root.schedule.wrapper)->module_ptr().get());
}

at::Tensor cast_floating(const at::Tensor& t, at::ScalarType dtype) {
  if (!t.defined() || !at::isFloatingType(t.scalar_type()) || t.scalar_type() == dtype) return t;
  return t.to(dtype);
}

}  // namespace

// ---- the schedule's entry points (called by FullyShardImpl::forward) ----------------

std::vector<at::Tensor> unit_pre_forward(ShardUnit& u, std::vector<at::Tensor> inputs) {
  DDP_CHECK(join_body_depth() == 0, "ddp::fully_shard(", u.name(),
            "): a sharded model cannot "
            "train inside ddp::join (Note [No fully_shard inside join]): a rank that ran out "
            "of inputs cannot stand in for its rows in the others' all-gathers and "
            "reduce-scatters. Give every rank the same number of batches (a "
            "DistributedSampler with drop_last, or a fixed number of steps), and leave the "
            "sharded model out of join.");
  if (!u.schedule.root) lazy_init_root(u);
  RootStep& st = step_of(u);
  const bool grad = at::GradMode::is_enabled();
  if (u.schedule.is_root) {
    if (st.active && st.training && !st.backward_started && st.live_graphs->load() > 0) {
      DDP_CHECK(!grad, "ddp::fully_shard(", u.name(),
                "): a forward with gradients ran again "
                "while the previous forward's autograd graph still waits for its backward. A "
                "sharded model runs one backward per forward: call backward() on the first "
                "output (or drop it) before the next forward, and accumulate gradients over "
                "several forward/backward pairs with set_requires_gradient_sync(false). "
                "(Forwards without gradients, e.g. under NoGradGuard, may run in between.)");
      st.side = true;
    } else {
      if (st.active) end_step(st);
      st.active = true;
      st.training = grad;
      st.backward_started = false;
      st.forward_order.clear();
      for (ShardUnit* v : st.units) {
        v->schedule.ran_forward = false;
        v->schedule.post_backward_done = false;
      }
    }
  } else {
    DDP_CHECK(st.active, "ddp::fully_shard(", u.name(),
              "): this unit's forward ran outside "
              "its root's forward (",
              u.schedule.root->name(),
              "). Call the root unit; its "
              "forward runs the blocks.");
  }
  if (!st.side) {
    u.schedule.ran_forward = true;
    u.schedule.post_backward_done = false;
    st.forward_order.push_back(&u);
  }
  u.finish_unshard();
  // Forward prefetch: the unit that came next in the last step.
  const size_t pos = st.forward_order.size() - 1;
  if (!st.side && pos + 1 < st.last_forward_order.size() && st.last_forward_order[pos] == &u) {
    ShardUnit* next = st.last_forward_order[pos + 1];
    if (!next->schedule.ran_forward) next->start_unshard();
  }

  const MixedPrecisionPolicy& mp = u.options().mp_policy();
  if (mp.param_dtype() && mp.cast_forward_inputs()) {
    for (at::Tensor& t : inputs) t = cast_floating(t, *mp.param_dtype());
  }
  const bool any_grad = grad && std::any_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) {
                          return t.defined() && t.requires_grad();
                        });
  if (any_grad) {
    auto ref = c10::make_intrusive<UnitRef>(&u, st.live_graphs);
    inputs = PostBackward::apply(at::TensorList(inputs), c10::IValue::make_capsule(std::move(ref)));
  }
  return inputs;
}

std::vector<at::Tensor> unit_post_forward(ShardUnit& u, std::vector<at::Tensor> outputs,
                                          bool known) {
  RootStep& st = step_of(u);
  const bool grad = at::GradMode::is_enabled();
  const bool any_grad =
      grad && std::any_of(outputs.begin(), outputs.end(),
                          [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
  if (any_grad && known) {
    auto ref = c10::make_intrusive<UnitRef>(&u, st.live_graphs);
    outputs =
        PreBackward::apply(at::TensorList(outputs), c10::IValue::make_capsule(std::move(ref)));
    if (effective_reshard(u)) u.reshard();
  } else if (!any_grad) {
    u.reshard();  // nothing will run backward through this unit
  }
  // (any_grad && !known: an output type whose tensors cannot be hooked; the unit stays
  // full until its backward is over.)
  if (u.schedule.is_root) {
    const auto& out_dtype = u.options().mp_policy().output_dtype();
    if (out_dtype) {
      for (at::Tensor& t : outputs) t = cast_floating(t, *out_dtype);
    }
    if (st.side) {
      st.side = false;
    } else if (!any_grad) {
      end_step(st);
    }
  }
  return outputs;
}

void unit_forward_failed(ShardUnit& u) {
  if (!u.schedule.root || !u.schedule.root->schedule.step) return;
  RootStep& st = step_of(u);
  if (!u.schedule.is_root) return;
  if (st.side) {
    st.side = false;
  } else {
    end_step(st);
  }
}

// ---- making units ----------------------------------------------------------------

void check_can_shard(const Module& module) {
  if (auto unit = registered_unit(&module)) {
    DDP_CHECK(false, "ddp::fully_shard: ", module.name(),
              " is already sharded (fully_shard "
              "was applied to it before). Apply fully_shard once per module.");
  }
  DDP_CHECK(dynamic_cast<const FullyShardBase*>(&module) == nullptr,
            "ddp::fully_shard: pass the ddp::FullyShard<M> holder, not its impl.");
}

namespace {

/// The units inside `root` (not `root` itself), found through the tree's wrappers and
/// the registry.
std::unordered_set<const ShardUnit*> nested_units(Module& root) {
  std::unordered_set<const ShardUnit*> found;
  for (const auto& m : root.modules(/*include_self=*/false)) {
    if (auto* w = dynamic_cast<FullyShardBase*>(m.get())) {
      if (w->is_sharded()) found.insert(&w->unit());
    } else if (auto w2 = registered_unit(m.get())) {
      if (w2->is_sharded()) found.insert(&w2->unit());
    }
  }
  return found;
}

/// Note [Units take their module's place] (fully_shard.h): every registry and container
/// entry in `root`'s tree that names a module with a unit now names the unit. Checks
/// first, changes after.
void place_units(Module& root) {
  const TreeSurvey survey = survey_tree(
      root,
      [](const Module& child) {
        return dynamic_cast<const FullyShardBase*>(&child) == nullptr &&
               registered_unit(&child) != nullptr;
      },
      // A unit registers its module's children as its own: the module's registry and
      // containers hold them too.
      [](Module& m) -> Module* {
        auto* w = dynamic_cast<FullyShardBase*>(&m);
        return w ? w->module_ptr().get() : nullptr;
      });
  if (survey.sites.empty()) return;

  std::vector<std::shared_ptr<Module>> hold;
  std::unordered_set<const Module*> checked;
  for (const ChildSite& s : survey.sites) {
    if (!checked.insert(s.child).second) continue;
    std::shared_ptr<Module> m = s.parent->named_children()[s.name];
    Registered reg;
    auto unit = registered_unit(m.get(), &reg);
    // The unit holds its module twice (type-erased and typed).
    const long outside = survey.outside(m, 2);
    DDP_CHECK(outside <= 0, "ddp::fully_shard: the ", m->name(), " at '", s.path,
              "' is a unit, but it is also held outside the module tree (", outside,
              " more reference", outside == 1 ? "" : "s",
              " than its registrations), "
              "typically by a typed field of its parent such as `",
              m->name(), " ", s.name,
              ";`. That field cannot hold the unit, so the model's forward would call the "
              "module without its all-gather. Declare the field as ddp::FullyShard<",
              m->name(),
              "> (a plain pass-through until sharded), or reach the module through "
              "torch::nn::Sequential, ModuleList or ModuleDict, or drop other references to "
              "it before fully_shard. Nothing was changed.");
    if (dynamic_cast<torch::nn::SequentialImpl*>(s.parent)) {
      DDP_CHECK(reg.as_any, "ddp::fully_shard: the ", m->name(), " at '", s.path,
                "' is in a torch::nn::Sequential, which calls forward through a fixed "
                "signature, but its forward is a template or overloaded. Give it one forward, "
                "or keep it out of the Sequential.");
    }
    hold.push_back(std::move(m));
  }
  for (const ChildSite& s : survey.sites) {
    Registered reg;
    std::shared_ptr<FullyShardBase> unit = registered_unit(s.child, &reg);
    replace_child(*s.parent, s.name, s.child, unit,
                  reg.as_any ? reg.as_any() : torch::nn::AnyModule());
    // A unit whose module is this parent registered the module's children as its own.
    if (auto parent_unit = registered_unit(s.parent)) {
      parent_unit->replace_module(s.name, unit);
    }
  }
  for (const ChildSite& s : survey.sites) release_keep(s.child);
}

}  // namespace

}  // namespace detail

// ---- FullyShardBase ---------------------------------------------------------------

FullyShardBase::FullyShardBase(std::shared_ptr<torch::nn::Module> module)
    : torch::nn::Module("ddp::FullyShard<" + module->name() + ">"), module_(std::move(module)) {
  // Note [Units take their module's place]: the module's own parameters, buffers and
  // children, under their names, so that keys do not change.
  detail::adopt_members(*this, *module_);
}

void FullyShardBase::shard(const FullyShardOptions& options,
                           std::function<torch::nn::AnyModule()> as_any) {
  using detail::ShardUnit;
  DDP_CHECK(!unit_, "ddp::fully_shard: ", module_->name(),
            " is already sharded (fully_shard "
            "was applied to it before). Apply fully_shard once per module.");
  std::shared_ptr<ProcessGroup> pg = options.process_group();
  std::shared_ptr<ProcessGroup> replicate;
  if (options.mesh()) {
    const DeviceMesh& mesh = *options.mesh();
    DDP_CHECK(!pg, "ddp::fully_shard(", module_->name(),
              "): both a mesh and a process_group "
              "were given; pass one.");
    DDP_CHECK(mesh.ndim() == 1 || mesh.ndim() == 2, "ddp::fully_shard(", module_->name(),
              "): the mesh must be 1-D (shard) or 2-D (replicate, shard), but it has ", mesh.ndim(),
              " dimensions: ", mesh.to_string(), ". Pass a submesh (mesh[{...}]).");
    pg = mesh.get_group(mesh.ndim() - 1);
    if (mesh.ndim() == 2) replicate = mesh.get_group(0);
  }
  if (!pg) {
    DDP_CHECK(is_initialized(), "ddp::fully_shard(", module_->name(),
              ") needs a process group, "
              "but the default one is not initialised and FullyShardOptions::process_group is "
              "not set. Call ddp::init_process_group() first, or pass a group.");
    pg = default_group();
  }
  // Units inside this module were sharded first (bottom-up); the rest is this unit's.
  // Put them in their modules' places first, so this unit's registry sees them.
  detail::place_units(*this);  // this unit's registry and its module's
  const auto mine = named_children();
  for (const auto& item : module_->named_children()) {
    const auto* old = mine.find(item.key());
    if (old != nullptr && old->get() != item.value().get())
      replace_module(item.key(), item.value());
  }
  const auto nested = detail::nested_units(*module_);
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::unordered_set<const void*> seen;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!p.defined() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    if (ShardUnit* owner = detail::unit_of_param(p)) {
      DDP_CHECK(nested.count(owner) > 0, "ddp::fully_shard(", module_->name(), "): parameter '",
                item.key(), "' is already sharded by the unit of ", owner->name(),
                ", which is not inside this module: fully_shard was applied to a module after "
                "the module around it. Apply it bottom-up: blocks first, the root last.");
      continue;
    }
    DDP_CHECK(!detail::is_ddp_param(p), "ddp::fully_shard(", module_->name(), "): parameter '",
              item.key(),
              "' belongs to a DistributedDataParallel. A parameter is either "
              "replicated by DDP or sharded by fully_shard, not both: shard the unwrapped "
              "module and drop the DDP wrapper.");
    DDP_CHECK(p.is_leaf(), "ddp::fully_shard(", module_->name(), "): parameter '", item.key(),
              "' is not a leaf tensor (it was computed from other tensors with gradients "
              "recorded); register leaf tensors as parameters.");
    params.emplace_back(item.key(), p);
  }
  if (pg->device().is_cpu()) detail::default_cpu_caching_allocator();
  auto unit = std::make_shared<ShardUnit>(module_->name(), pg, options);
  unit->set_replicate(replicate);
  unit->shard(std::move(params));
  unit->schedule.wrapper = this;
  unit_ = std::move(unit);
  // Parameters moved to the group's device keep their identity; buffers follow.
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    if (item.value().defined() && item.value().device() != pg->device()) {
      item.value().set_data(item.value().to(pg->device()));
    }
  }
  std::lock_guard<std::mutex> lock(detail::registry_mutex());
  auto self = std::static_pointer_cast<FullyShardBase>(shared_from_this());
  detail::registry()[module_.get()] = {self, self, std::move(as_any)};
}

bool FullyShardBase::is_sharded() const { return unit_ != nullptr; }

void FullyShardBase::unshard() {
  DDP_CHECK(unit_, "ddp::FullyShard::unshard: ", module_->name(), " is not sharded yet.");
  unit_->finish_unshard();
}

void FullyShardBase::reshard() {
  DDP_CHECK(unit_, "ddp::FullyShard::reshard: ", module_->name(), " is not sharded yet.");
  unit_->reshard();
}

void FullyShardBase::set_requires_gradient_sync(bool sync, bool recurse) {
  if (unit_) unit_->schedule.requires_gradient_sync = sync;
  if (!recurse) return;
  for (const auto& m : modules(/*include_self=*/false)) {
    if (auto* w = dynamic_cast<FullyShardBase*>(m.get()))
      w->set_requires_gradient_sync(sync, false);
  }
}

void FullyShardBase::set_requires_all_reduce(bool requires_all_reduce, bool recurse) {
  if (unit_) unit_->set_requires_all_reduce(requires_all_reduce);
  if (!recurse) return;
  for (const auto& m : modules(/*include_self=*/false)) {
    if (auto* w = dynamic_cast<FullyShardBase*>(m.get()))
      w->set_requires_all_reduce(requires_all_reduce, false);
  }
}

void FullyShardBase::set_reshard_after_forward(bool reshard, bool recurse) {
  if (unit_) unit_->options().reshard_after_forward(reshard);
  if (!recurse) return;
  for (const auto& m : modules(/*include_self=*/false)) {
    if (auto* w = dynamic_cast<FullyShardBase*>(m.get()))
      w->set_reshard_after_forward(reshard, false);
  }
}

const FullyShardOptions& FullyShardBase::options() const {
  static const FullyShardOptions unsharded;
  return unit_ ? unit_->options() : unsharded;
}

void FullyShardBase::train(bool on) {
  Module::train(on);
  module_->train(on);
}

}  // namespace ddp
