// ddp::CheckpointWrapper and ddp::apply_activation_checkpointing: a module whose forward
// is checkpointed, and putting such wrappers in place of modules in a tree.

#include <ddp/algorithms/activation_checkpoint.h>

#include "distributed/common/check.h"
#include "modules/module_tree.h"
#include "modules/param_owners.h"

#include <ATen/core/grad_mode.h>
#include <torch/nn/modules/container/sequential.h>

#include <unordered_map>
#include <unordered_set>

namespace ddp {

namespace {

/// The fully_shard unit that is `module` or sits inside it, or nullptr: the owner of one
/// of its parameters (a unit registers every parameter it shards) whose module is in
/// `module`'s tree. A unit around `module` does not count: a checkpoint inside a unit is
/// the right place.
const detail::ShardOwner* unit_inside(torch::nn::Module& module) {
  std::unordered_set<const torch::nn::Module*> tree;
  for (const auto& m : module.modules(/*include_self=*/true)) tree.insert(m.get());
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    const detail::ShardOwner* unit = detail::shard_owner_of(p);
    if (unit != nullptr && tree.count(unit->module()) > 0) return unit;
  }
  return nullptr;
}

}  // namespace

CheckpointWrapperBase::CheckpointWrapperBase(std::shared_ptr<torch::nn::Module> module,
                                             ActivationCheckpointOptions options)
    : torch::nn::Module("ddp::CheckpointWrapper<" + module->name() + ">"),
      module_(std::move(module)),
      options_(options) {
  const detail::ShardOwner* unit = unit_inside(*module_);
  DDP_CHECK(unit == nullptr, "ddp::checkpoint_wrapper(", module_->name(),
            "): the module is or contains the fully_shard unit ", unit->name(),
            ". A unit's all-gathers and reduce-scatters are driven by its own autograd graph, "
            "which a checkpoint drops and recomputes, so the checkpoint must sit inside the "
            "unit: apply checkpoint_wrapper (or apply_activation_checkpointing) first, then "
            "ddp::fully_shard to the wrapper.");
  // The module's own parameters, buffers and children, under their names, so that keys
  // do not change (as Note [Units take their module's place] in fully_shard.h).
  detail::adopt_members(*this, *module_);
}

void CheckpointWrapperBase::train(bool on) {
  Module::train(on);
  module_->train(on);
}

void CheckpointWrapperBase::check_forward() const {
  if (!at::GradMode::is_enabled()) return;
  // A unit that encloses the wrapper has gathered its parameters before this forward; one
  // inside the wrapped module has not (its forward would run inside the checkpoint).
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    const detail::ShardOwner* unit = detail::shard_owner_of(item.value());
    DDP_CHECK(unit == nullptr || unit->unsharded(), name(), ": parameter '", item.key(),
              "' of the wrapped module belongs to the fully_shard unit ", unit->name(),
              ", which is inside the wrapper (its parameters are sharded as the wrapper's "
              "forward starts). A unit's all-gathers and reduce-scatters are driven by its own "
              "autograd graph, which a checkpoint drops and recomputes, so the checkpoint must "
              "sit inside the unit: apply checkpoint_wrapper (or "
              "apply_activation_checkpointing) first, then ddp::fully_shard to the wrapper.");
  }
}

namespace detail {

size_t wrap_submodules(
    torch::nn::Module& root, const std::function<bool(const torch::nn::Module&)>& is_target,
    const std::function<std::pair<std::shared_ptr<torch::nn::Module>, torch::nn::AnyModule>(
        const std::shared_ptr<torch::nn::Module>&)>& wrap,
    const std::string& what) {
  const TreeSurvey survey = survey_tree(root, is_target);
  // Checks first, changes after.
  std::unordered_set<const torch::nn::Module*> checked;
  for (const ChildSite& s : survey.sites) {
    if (!checked.insert(s.child).second) continue;
    std::shared_ptr<torch::nn::Module> m = s.parent->named_children()[s.name];
    const long outside = survey.outside(m);
    DDP_CHECK(outside <= 0, what, ": the ", m->name(), " at '", s.path,
              "' is also held outside the module tree (", outside, " more reference",
              outside == 1 ? "" : "s",
              " than its registrations), typically by a typed field of its parent such as `",
              m->name(), " ", s.name,
              ";`. That field cannot hold the checkpoint wrapper, so the model's forward would "
              "call the module without it. Declare the field as ddp::CheckpointWrapper<",
              m->name(),
              ">, or reach the module through torch::nn::Sequential, ModuleList or ModuleDict, "
              "or drop other references to it. Nothing was changed.");
    const detail::ShardOwner* unit = unit_inside(*m);
    DDP_CHECK(unit == nullptr, what, ": the ", m->name(), " at '", s.path,
              "' is or contains the fully_shard unit ", unit->name(),
              "; the checkpoint must sit inside the unit. Apply activation checkpointing "
              "first, then ddp::fully_shard. Nothing was changed.");
    if (dynamic_cast<torch::nn::SequentialImpl*>(s.parent) != nullptr) {
      DDP_CHECK(!wrap(m).second.is_empty(), what, ": the ", m->name(), " at '", s.path,
                "' is in a torch::nn::Sequential, which calls forward through a fixed "
                "signature, but its forward is a template or overloaded. Give it one "
                "forward, or keep it out of the Sequential. Nothing was changed.");
    }
  }
  // Deepest first, so that a wrapper registers the wrappers below it.
  std::unordered_map<const torch::nn::Module*,
                     std::pair<std::shared_ptr<torch::nn::Module>, torch::nn::AnyModule>>
      made;
  for (auto it = survey.sites.rbegin(); it != survey.sites.rend(); ++it) {
    const ChildSite& s = *it;
    auto found = made.find(s.child);
    if (found == made.end()) {
      found = made.emplace(s.child, wrap(s.parent->named_children()[s.name])).first;
    }
    replace_child(*s.parent, s.name, s.child, found->second.first, found->second.second);
  }
  return made.size();
}

}  // namespace detail

}  // namespace ddp
