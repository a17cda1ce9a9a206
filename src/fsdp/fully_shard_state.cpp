// What reads or writes a sharded model as a whole: the global gradient norm, and the
// full state dict gathered from the shards (or scattered into them).

#include <ddp/fsdp/fully_shard.h>

#include "distributed/common/check.h"
#include "fsdp/shard_unit.h"
#include "tensor_parallel/tp_comm.h"

#include <ddp/distributed/default_group.h>
#include <ddp/parallel/tensor_parallel.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

namespace ddp {
namespace {

using detail::ShardedParam;
using detail::ShardUnit;

}  // namespace

at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                           double norm_type) {
  DDP_CHECK(norm_type > 0, "ddp::clip_grad_norm_: norm_type must be > 0 (or infinity), but got ",
            norm_type, ".");
  DDP_CHECK(std::isfinite(max_norm) && max_norm >= 0,
            "ddp::clip_grad_norm_: max_norm must be a finite number >= 0, but got ", max_norm, ".");
  const bool inf = std::isinf(norm_type);
  auto combine = [inf](const at::Tensor& acc, const at::Tensor& part) {
    return !acc.defined() ? part : (inf ? at::maximum(acc, part) : acc + part);
  };
  std::vector<at::Tensor> grads;
  std::unordered_set<const void*> seen;
  // Each gradient's p-th power sum goes to the bucket of the groups its parameter is split
  // over (fully_shard's, tensor parallelism's, both or none), in the parameters' order, so
  // that every rank reduces the same buckets in the same order.
  struct Bucket {
    ProcessGroup* fsdp;
    std::shared_ptr<ProcessGroup> tp;
    at::Tensor part;
  };
  std::vector<Bucket> buckets;
  std::shared_ptr<ProcessGroup> fsdp_group;
  c10::optional<c10::Device> device;
  for (const at::Tensor& p : parameters) {
    if (!p.defined() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    ShardUnit* unit = detail::unit_of_param(p);
    if (unit) {
      DDP_CHECK(!fsdp_group || fsdp_group.get() == unit->group_ptr().get(),
                "ddp::clip_grad_norm_: the parameters are sharded over different process "
                "groups; pass the parameters of one group at a time.");
      fsdp_group = unit->group_ptr();
    }
    const auto tp = tensor_parallel_shard(p);
    std::shared_ptr<ProcessGroup> tp_group = tp ? tp->group : nullptr;
    auto it = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) {
      return b.fsdp == (unit ? unit->group_ptr().get() : nullptr) && b.tp == tp_group;
    });
    if (it == buckets.end()) {
      buckets.push_back(Bucket{unit ? unit->group_ptr().get() : nullptr, tp_group, at::Tensor()});
      it = buckets.end() - 1;
    }
    const at::Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!device) device = g.device();
    grads.push_back(g);
    at::Tensor part = inf ? g.detach().abs().max().to(at::kDouble)
                          : g.detach().to(at::kDouble).abs().pow(norm_type).sum();
    if (g.numel() == 0) part = at::zeros({}, part.options());
    it->part = combine(it->part, part);
  }
  const at::TensorOptions opts =
      at::TensorOptions()
          .dtype(at::kDouble)
          .device(device ? *device : (fsdp_group ? fsdp_group->device() : c10::Device(at::kCPU)));
  at::Tensor total;
  for (Bucket& b : buckets) {
    at::Tensor s = (b.part.defined() ? b.part.to(opts.device()) : at::zeros({}, opts)).reshape({1});
    if (b.fsdp) b.fsdp->all_reduce(s, inf ? ReduceOp::MAX : ReduceOp::SUM);
    if (b.tp) b.tp->all_reduce(s, inf ? ReduceOp::MAX : ReduceOp::SUM);
    total = combine(total, s.reshape({}));
  }
  if (!total.defined()) total = at::zeros({}, opts);
  if (!inf) total = total.pow(1.0 / norm_type);
  const double norm = total.item<double>();
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1) {
    at::NoGradGuard no_grad;
    for (at::Tensor& g : grads) g.mul_(coef);
  }
  return total.to(at::kFloat);
}

c10::Dict<std::string, at::Tensor> full_state_dict(torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> items;
  std::unordered_map<const void*, at::Tensor> gathered;  // tied weights: gathered once
  // Rank 0 of the default group keeps the result; with sharded parameters, the rank that
  // is rank 0 of each group they are sharded over.
  bool sharded = false, first = true;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    at::Tensor value = item.value();
    at::Tensor& full = gathered[value.unsafeGetTensorImpl()];
    if (full.defined()) {
      items.emplace_back(item.key(), full);
      continue;
    }
    if (const detail::ShardedRef ref = detail::sharded_ref(value)) {
      sharded = true;
      first = first && ref.unit->group().rank() == 0;
      DDP_CHECK(!ref.unit->unsharded(), "ddp::full_state_dict: unit ", ref.unit->name(),
                " holds its full parameters (between a forward and its backward, or after "
                "unshard()); call it after the step, or reshard() first.");
      value = ref.unit->gather_rows(*ref.param, ref.param->shard);
    }
    // Note [Tensor-parallel forward]: the rank's chunk along the style's dimension.
    if (const auto tp = tensor_parallel_shard(item.value())) {
      sharded = true;
      first = first && tp->group->rank() == 0;
      value = detail::tp::gather_along(
          value, tp->dim,
          detail::tp::chunk_sizes(tp->full_size[static_cast<size_t>(tp->dim)], tp->group->size()),
          *tp->group);
    }
    full = value;
    items.emplace_back(item.key(), value);
  }
  c10::Dict<std::string, at::Tensor> out;
  if (sharded ? !first : (is_initialized() && get_rank() != 0)) return out;
  for (auto& kv : items) out.insert(kv.first, kv.second.detach().to(at::kCPU));
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) out.insert(item.key(), item.value().detach().to(at::kCPU));
  }
  return out;
}

namespace {

/// The first problem with loading `state` into `model`, or "".
std::string check_state(torch::nn::Module& model, const c10::Dict<std::string, at::Tensor>& state) {
  std::unordered_set<std::string> known;
  auto check = [&](const std::string& key, at::IntArrayRef sizes) -> std::string {
    known.insert(key);
    const auto found = state.find(key);
    if (found == state.end()) {
      return "ddp::load_full_state_dict: key '" + key +
             "' of the model is missing from the state dict. Save it with "
             "ddp::full_state_dict from the same model.";
    }
    if (found->value().sizes() != sizes) {
      return c10::str("ddp::load_full_state_dict: key '", key, "' has shape ",
                      found->value().sizes(), " in the state dict but ", sizes, " in the model.");
    }
    return "";
  };
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor& t = item.value();
    std::vector<int64_t> sizes = t.sizes().vec();
    if (const detail::ShardedRef ref = detail::sharded_ref(t)) sizes = ref.param->sizes;
    if (const auto tp = tensor_parallel_shard(t)) sizes = tp->full_size;
    std::string problem = check(item.key(), sizes);
    if (!problem.empty()) return problem;
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    if (!item.value().defined()) continue;
    std::string problem = check(item.key(), item.value().sizes());
    if (!problem.empty()) return problem;
  }
  for (const auto& kv : state) {
    if (known.count(kv.key()) == 0) {
      return "ddp::load_full_state_dict: key '" + kv.key() +
             "' of the state dict names no parameter or buffer of the model.";
    }
  }
  return "";
}

}  // namespace

void load_full_state_dict(torch::nn::Module& model, const c10::Dict<std::string, at::Tensor>& state,
                          bool from_rank0) {
  at::NoGradGuard no_grad;
  std::shared_ptr<ProcessGroup> group;
  bool tensor_parallel = false;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (ShardUnit* unit = detail::unit_of_param(item.value())) {
      group = unit->group_ptr();
      DDP_CHECK(!unit->unsharded(), "ddp::load_full_state_dict: unit ", unit->name(),
                " holds its full parameters; call it between steps, or reshard() first.");
    }
    if (const auto tp = tensor_parallel_shard(item.value())) {
      tensor_parallel = true;
      if (!group) group = tp->group;
    }
  }
  // With tensor parallelism the state is on rank 0 of the whole job, which the sharding
  // groups (each a row or column of the mesh) need not reach.
  if ((!group || tensor_parallel) && is_initialized()) group = default_group();
  const int rank = group ? group->rank() : 0;
  from_rank0 = from_rank0 && group && group->size() > 1;
  // Every rank learns rank 0's verdict before any broadcast, so none waits for a rank
  // that gave up.
  std::string problem = (from_rank0 && rank != 0) ? "" : check_state(model, state);
  if (from_rank0) problem = group->all_gather_bytes(problem)[0];
  DDP_CHECK(problem.empty(), problem, " (rank ", rank, ")");

  std::unordered_set<const void*> done;
  auto load = [&](const std::string& key, const at::Tensor& target) {
    if (!done.insert(target.unsafeGetTensorImpl()).second) return;
    const detail::ShardedRef ref = detail::sharded_ref(target);
    const ShardedParam* p = ref.param;
    const at::TensorOptions opts = p ? p->shard.options() : target.options();
    const auto tp = tensor_parallel_shard(target);
    const std::vector<int64_t> sizes = tp ? tp->full_size : p ? p->sizes : target.sizes().vec();
    at::Tensor value;
    if (from_rank0) {
      value = rank == 0 ? state.at(key).to(opts).contiguous() : at::empty(sizes, opts);
      group->broadcast(value, 0);
    } else {
      value = state.at(key);
    }
    if (tp) {  // this rank's chunk along the style's dimension
      const int64_t d = tp->dim;
      value = value.narrow(d, tp->offset,
                           detail::tp::chunk_sizes(tp->full_size[static_cast<size_t>(d)],
                                                   tp->group->size())[tp->group->rank()]);
    }
    if (p) {
      p->shard.copy_(ref.unit->rows_of_this_rank(*p, value));
    } else {
      target.copy_(value);
    }
  };
  for (const auto& item : model.named_parameters(/*recurse=*/true)) load(item.key(), item.value());
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) load(item.key(), item.value());
  }
}

}  // namespace ddp
