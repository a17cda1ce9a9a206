#include "serialize/sharded_model.h"

#include "parallel/shard_unit.h"
#include "serialize/optimizer_state.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

namespace ddp {
namespace detail {
namespace {

const ShardedParam* sharded_param(const at::Tensor& t, ShardUnit** unit_out = nullptr) {
  ShardUnit* unit = unit_of_param(t);
  if (!unit) return nullptr;
  for (const ShardedParam& p : unit->params()) {
    if (p.param.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
      if (unit_out) *unit_out = unit;
      return &p;
    }
  }
  return nullptr;
}

/// Every rank's rows of `rows` (this rank's, shaped like the shard) put together.
at::Tensor gather_rows(ShardUnit& unit, const ShardedParam& p, const at::Tensor& rows) {
  ProcessGroup& pg = unit.group();
  at::Tensor padded = at::zeros({p.chunk_rows, p.row_numel}, rows.options());
  if (p.local_rows > 0)
    padded.narrow(0, 0, p.local_rows).copy_(rows.reshape({p.local_rows, p.row_numel}));
  at::Tensor out = at::empty({pg.size() * p.chunk_rows, p.row_numel}, padded.options());
  pg.all_gather_into_tensor(out, padded);
  return out.narrow(0, 0, p.rows).reshape(p.sizes).contiguous();
}

at::Tensor my_rows(const ShardUnit& unit, const ShardedParam& p, const at::Tensor& full) {
  return full.reshape({p.rows, p.row_numel})
      .narrow(0, p.first_row(unit.group().rank()), p.local_rows)
      .reshape(p.shard_sizes(p.local_rows))
      .clone();
}

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
    ShardUnit* unit = nullptr;
    const ShardedParam* p = sharded_param(params[i], &unit);
    if (!p) continue;
    const auto entry = state.find(static_cast<int64_t>(i));
    // Every rank has the same entries: a parameter some rank used has a gradient on all.
    if (entry == state.end()) continue;
    c10::impl::GenericDict values = entry->value().toGenericDict();
    for (const auto& kv : values) {
      if (!kv.value().isTensor()) continue;
      const at::Tensor t = kv.value().toTensor();
      if (t.sizes() != p->shard.sizes()) continue;  // a scalar such as "step"
      values.insert_or_assign(kv.key(), gather_rows(*unit, *p, t.to(p->shard.device())).cpu());
    }
  }
  return out;
}

c10::Dict<std::string, at::Tensor> shard_model_state(
    const torch::nn::Module& model, const c10::Dict<std::string, at::Tensor>& state) {
  c10::Dict<std::string, at::Tensor> out;
  std::unordered_map<std::string, std::pair<ShardUnit*, const ShardedParam*>> sharded;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    ShardUnit* unit = nullptr;
    if (const ShardedParam* p = sharded_param(item.value(), &unit)) sharded[item.key()] = {unit, p};
  }
  for (const auto& kv : state) {
    const auto it = sharded.find(kv.key());
    const ShardedParam* p = it == sharded.end() ? nullptr : it->second.second;
    if (p && kv.value().sizes() == at::IntArrayRef(p->sizes)) {
      out.insert(kv.key(), my_rows(*it->second.first, *p, kv.value()));
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
    ShardUnit* unit = nullptr;
    const ShardedParam* p = sharded_param(params[i], &unit);
    if (!p) continue;
    c10::impl::GenericDict values = entry.value().toGenericDict().copy();
    for (const auto& kv : entry.value().toGenericDict()) {
      if (!kv.value().isTensor()) continue;
      const at::Tensor t = kv.value().toTensor();
      if (t.sizes() != at::IntArrayRef(p->sizes) || t.dim() == 0) continue;
      values.insert_or_assign(kv.key(), my_rows(*unit, *p, t));
    }
    state.insert_or_assign(entry.key(), values);
  }
  out.insert_or_assign("state", state);
  return out;
}

}  // namespace detail
}  // namespace ddp
