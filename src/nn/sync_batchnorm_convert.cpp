// convert_sync_batchnorm: BatchNorm{1,2,3}d -> SyncBatchNorm throughout a module tree.
//
// Note [Who else holds the layer]
// A LibTorch module reaches its children in one of two ways: through the registry
// (register_module; what named_children(), state dicts and containers' forward see) or
// through a typed field that a user's forward calls (`torch::nn::BatchNorm2d bn;`).
// Replacing the registry entry cannot touch such a field, and the field's type cannot
// hold a SyncBatchNorm, so the model's forward would keep calling the old layer: a model
// that looks converted (its state dict names the new layers) but never synchronises.
// PyTorch has no such case, since Python attributes are the registry. Conversion
// therefore counts the references to each BatchNorm that the tree itself holds (one per
// registry entry, one per entry in a Sequential, ModuleList or ModuleDict, whose forward
// goes through those) and compares them with the shared_ptr's use count. A layer with
// more references is held from outside, and conversion throws before it has changed
// anything. Containers are updated along with the registry, so their forward runs the
// new layers.

#include <ddp/nn/sync_batchnorm.h>

#include "distributed/common/check.h"
#include "modules/module_tree.h"

#include <c10/util/Exception.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ddp {
namespace {

using detail::ChildSite;
using detail::TreeSurvey;

using torch::nn::Module;

bool is_batchnorm(const Module& m) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m) != nullptr;
}

}  // namespace

namespace detail {

std::shared_ptr<SyncBatchNormImpl> sync_batchnorm_sharing_state_of(
    const Module& batchnorm, std::shared_ptr<ProcessGroup> process_group) {
  std::shared_ptr<SyncBatchNormImpl> sync;
  auto adopt = [&](const auto* bn) {
    if (bn == nullptr) return;
    const torch::nn::BatchNormOptions& o = bn->options;
    auto options = SyncBatchNormOptions(o.num_features())
                       .eps(o.eps())
                       .momentum(o.momentum())
                       .affine(o.affine())
                       .track_running_stats(o.track_running_stats())
                       .process_group(process_group);
    // Not make_shared: the sharing constructor is private to this friend.
    sync.reset(
        new SyncBatchNormImpl(std::move(options),
                              SyncBatchNormImpl::SharedState{bn->weight, bn->bias, bn->running_mean,
                                                             bn->running_var,
                                                             bn->num_batches_tracked}));
  };
  adopt(dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&batchnorm));
  adopt(dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&batchnorm));
  adopt(dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&batchnorm));
  TORCH_INTERNAL_ASSERT(sync, "not a BatchNorm: ", batchnorm.name());
  sync->train(batchnorm.is_training());
  return sync;
}

}  // namespace detail

std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> module,
                                               std::shared_ptr<ProcessGroup> process_group) {
  DDP_CHECK(module != nullptr, "convert_sync_batchnorm got a null module; construct the "
                               "module before converting it.");
  if (is_batchnorm(*module)) {
    return detail::sync_batchnorm_sharing_state_of(*module, std::move(process_group));
  }

  const TreeSurvey survey = detail::survey_tree(*module, is_batchnorm);

  // Check every layer before changing any (Note [Who else holds the layer]).
  std::vector<std::shared_ptr<Module>> layers;  // keeps the old layers alive until done
  std::unordered_set<const Module*> checked;
  for (const ChildSite& site : survey.sites) {
    if (!checked.insert(site.child).second) continue;
    std::shared_ptr<Module> layer = site.parent->named_children()[site.name];
    const long outside = survey.outside(layer);
    DDP_CHECK(outside <= 0, "convert_sync_batchnorm: the ", layer->name(), " at '", site.path,
              "' is also held outside the module tree (", outside, " more reference",
              outside == 1 ? "" : "s",
              " than its registrations), "
              "typically by a typed field of its parent such as `torch::nn::BatchNorm2d ",
              site.name,
              ";`. That field cannot hold a SyncBatchNorm, so the model's "
              "forward would keep running the unsynchronised layer. Declare the field as "
              "ddp::SyncBatchNorm (a plain BatchNorm until trained with several ranks; "
              "same state-dict keys), or reach the layer through torch::nn::Sequential, "
              "ModuleList or ModuleDict, or drop other references to it before "
              "converting. Nothing was converted.");
    layers.push_back(std::move(layer));
  }

  std::unordered_map<const Module*, std::shared_ptr<SyncBatchNormImpl>> made;
  for (const ChildSite& site : survey.sites) {
    std::shared_ptr<SyncBatchNormImpl>& sync = made[site.child];
    if (!sync) sync = detail::sync_batchnorm_sharing_state_of(*site.child, process_group);
    detail::replace_child(*site.parent, site.name, site.child, sync, torch::nn::AnyModule(sync));
  }
  return module;
}

}  // namespace ddp
