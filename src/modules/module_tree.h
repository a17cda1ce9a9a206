#pragma once

// Replacing a module inside a LibTorch module tree: what convert_sync_batchnorm and
// fully_shard both do (Note [Who else holds the layer] in sync_batchnorm_convert.cpp).

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace ddp {
namespace detail {

/// One registry entry to replace.
struct ChildSite {
  torch::nn::Module* parent;
  std::string name;
  torch::nn::Module* child;
  std::string path;  // from the root, as named_modules() spells it
};

struct TreeSurvey {
  /// The tree's own references to each module: one per registry entry, one per entry in
  /// a Sequential, ModuleList or ModuleDict.
  std::unordered_map<const torch::nn::Module*, long> tree_refs;
  std::vector<ChildSite> sites;

  /// How many more references `module` (held once more by the caller) has than the tree
  /// and `own` (the replacement's own) account for: > 0 means a field holds it.
  long outside(const std::shared_ptr<torch::nn::Module>& module, long own = 0) const {
    return module.use_count() - 1 - tree_refs.at(module.get()) - own;
  }
};

/// Walks `root`'s tree, each module once. `is_site(child)` picks the registry entries to
/// replace; `also(m)`, when it returns a module, is walked too from m's path (a module
/// whose children `m` registers as its own, such as a fully_shard unit's).
TreeSurvey survey_tree(torch::nn::Module& root,
                       const std::function<bool(const torch::nn::Module&)>& is_site,
                       const std::function<torch::nn::Module*(torch::nn::Module&)>& also = nullptr);

/// Points `parent`'s registry entry `name`, and its container entries that hold `old`, at
/// `now` (a Sequential at `as_any`, which must wrap `now`).
void replace_child(torch::nn::Module& parent, const std::string& name, const torch::nn::Module* old,
                   const std::shared_ptr<torch::nn::Module>& now,
                   const torch::nn::AnyModule& as_any);

std::string join_path(const std::string& path, const std::string& name);

/// Registers `module`'s own parameters, buffers and children on `wrapper` under the same
/// names, and takes its training mode: a wrapper that stands in the module's place
/// (a fully_shard unit, a checkpoint wrapper) keeps the module's state-dict keys and
/// tensors (Note [Units take their module's place] in fully_shard.h).
void adopt_members(torch::nn::Module& wrapper, const torch::nn::Module& module);

}  // namespace detail
}  // namespace ddp
