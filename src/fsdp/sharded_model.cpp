#include "fsdp/sharded_model.h"

#include "fsdp/shard_unit.h"
#include "formats/optimizer_state.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

namespace ddp {
namespace detail {
namespace {

std::vector<at::Tensor> optimizer_params(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> out;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) out.push_back(p);
  }
  return out;
}

}  // namespace

bool model_is_sharded(const torch::nn::Module& model) {
  for (const auto& p : model.parameters()) {
    if (unit_of_param(p)) return true;
  }
  return false;
}

c10::impl::GenericDict gather_optimizer_state(const torch::optim::Optimizer& optimizer,
                                              const torch::nn::Module& model) {
  c10::impl::GenericDict out = optimizer_state_dict(optimizer, model);
  c10::impl::GenericDict state = out.at("state").toGenericDict();
  const std::vector<at::Tensor> params = optimizer_params(optimizer);
  for (size_t i = 0; i < params.size(); ++i) {
    const ShardedRef ref = sharded_ref(params[i]);
    if (!ref) continue;
    const auto entry = state.find(static_cast<int64_t>(i));
    // Every rank has the same entries: a parameter some rank used has a gradient on all.
    if (entry == state.end()) continue;
    c10::impl::GenericDict values = entry->value().toGenericDict();
    for (const auto& kv : values) {
      if (!kv.value().isTensor()) continue;
      const at::Tensor t = kv.value().toTensor();
      if (t.sizes() != ref.param->shard.sizes()) continue;  // a scalar such as "step"
      values.insert_or_assign(
          kv.key(), ref.unit->gather_rows(*ref.param, t.to(ref.param->shard.device())).cpu());
    }
  }
  return out;
}

c10::Dict<std::string, at::Tensor> shard_model_state(
    const torch::nn::Module& model, const c10::Dict<std::string, at::Tensor>& state) {
  c10::Dict<std::string, at::Tensor> out;
  std::unordered_map<std::string, ShardedRef> sharded;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (const ShardedRef ref = sharded_ref(item.value())) sharded[item.key()] = ref;
  }
  for (const auto& kv : state) {
    const auto it = sharded.find(kv.key());
    const ShardedParam* p = it == sharded.end() ? nullptr : it->second.param;
    if (p && kv.value().sizes() == at::IntArrayRef(p->sizes)) {
      out.insert(kv.key(), it->second.unit->rows_of_this_rank(*p, kv.value()));
    } else {
      out.insert(kv.key(), kv.value());  // validated (and refused) by the model's load
    }
  }
  return out;
}

c10::IValue shard_optimizer_state(const torch::optim::Optimizer& optimizer,
                                  const c10::IValue& saved) {
  if (!saved.isGenericDict()) return saved;
  const c10::impl::GenericDict top = saved.toGenericDict();
  const auto state_it = top.find("state");
  if (state_it == top.end() || !state_it->value().isGenericDict()) return saved;
  c10::impl::GenericDict out = top.copy();
  c10::impl::GenericDict state = state_it->value().toGenericDict().copy();
  const std::vector<at::Tensor> params = optimizer_params(optimizer);
  for (const auto& entry : state_it->value().toGenericDict()) {
    if (!entry.key().isInt() || !entry.value().isGenericDict()) continue;
    const int64_t i = entry.key().toInt();
    if (i < 0 || i >= static_cast<int64_t>(params.size())) continue;
    const ShardedRef ref = sharded_ref(params[i]);
    if (!ref) continue;
    c10::impl::GenericDict values = entry.value().toGenericDict().copy();
    for (const auto& kv : entry.value().toGenericDict()) {
      if (!kv.value().isTensor()) continue;
      const at::Tensor t = kv.value().toTensor();
      if (t.sizes() != at::IntArrayRef(ref.param->sizes) || t.dim() == 0) continue;
      values.insert_or_assign(kv.key(), ref.unit->rows_of_this_rank(*ref.param, t));
    }
    state.insert_or_assign(entry.key(), values);
  }
  out.insert_or_assign("state", state);
  return out;
}

}  // namespace detail
}  // namespace ddp
