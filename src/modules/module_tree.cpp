#include "modules/module_tree.h"

#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <unordered_set>

namespace ddp {
namespace detail {

using torch::nn::Module;

std::string join_path(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}

TreeSurvey survey_tree(Module& root, const std::function<bool(const Module&)>& is_site,
                       const std::function<Module*(Module&)>& also) {
  TreeSurvey survey;
  std::unordered_set<const Module*> visited;
  std::function<void(Module&, const std::string&)> walk = [&](Module& m, const std::string& path) {
    if (!visited.insert(&m).second) return;  // a module registered in several places
    const auto children = m.named_children();
    for (const auto& item : children) {
      survey.tree_refs[item.value().get()] += 1;
      if (is_site(*item.value())) {
        survey.sites.push_back({&m, item.key(), item.value().get(), join_path(path, item.key())});
      }
    }
    if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&m)) {
      for (const auto& any : *seq) survey.tree_refs[any.ptr().get()] += 1;
    } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&m)) {
      for (const auto& child : *list) survey.tree_refs[child.get()] += 1;
    } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&m)) {
      for (const auto& item : *dict) survey.tree_refs[item.value().get()] += 1;
    }
    for (const auto& item : children) walk(*item.value(), join_path(path, item.key()));
    if (also) {
      if (Module* other = also(m)) walk(*other, path);
    }
  };
  walk(root, "");
  return survey;
}

void replace_child(Module& parent, const std::string& name, const Module* old,
                   const std::shared_ptr<Module>& now, const torch::nn::AnyModule& as_any) {
  parent.replace_module(name, now);
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
    for (auto& any : *seq) {
      if (any.ptr().get() == old) any = as_any;
    }
  } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent)) {
    for (auto& child : *list) {
      if (child.get() == old) child = now;
    }
  } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
    for (auto& item : *dict) {
      if (item.value().get() == old) item.value() = now;
    }
  }
}

void adopt_members(torch::nn::Module& wrapper, const torch::nn::Module& module) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    wrapper.register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    wrapper.register_buffer(item.key(), item.value());
  }
  for (const auto& item : module.named_children()) {
    wrapper.register_module(item.key(), item.value());
  }
  wrapper.train(module.is_training());
}

}  // namespace detail
}  // namespace ddp
