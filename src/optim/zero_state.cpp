#include "optim/zero_state.h"

#include "distributed/common/check.h"
#include "distributed/comm.h"
#include "formats/optimizer_state.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstring>
#include <map>

namespace ddp {

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  auto add = [&bytes](const at::Tensor& t) {
    if (t.defined()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  };
  for (const auto& entry : optimizer.state()) {
    const torch::optim::OptimizerParamState* s = entry.second.get();
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(s)) {
      add(sgd->momentum_buffer());
    } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(s)) {
      add(adam->exp_avg());
      add(adam->exp_avg_sq());
      add(adam->max_exp_avg_sq());
    } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(s)) {
      add(adamw->exp_avg());
      add(adamw->exp_avg_sq());
      add(adamw->max_exp_avg_sq());
    } else if (const auto* adagrad = dynamic_cast<const torch::optim::AdagradParamState*>(s)) {
      add(adagrad->sum());
    } else if (const auto* rms = dynamic_cast<const torch::optim::RMSpropParamState*>(s)) {
      add(rms->square_avg());
      add(rms->momentum_buffer());
      add(rms->grad_avg());
    }
  }
  return bytes;
}

int64_t ZeroRedundancyOptimizer::local_state_bytes() const {
  return optimizer_state_bytes(*local_);
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to_rank) {
  consolidated_ = detail::gather_zero_state(*this, to_rank);
}

c10::impl::GenericDict ZeroRedundancyOptimizer::state_dict() const {
  DDP_CHECK(consolidated_.has_value(), "ZeroRedundancyOptimizer::state_dict() on rank ",
            group_->rank(),
            ": the state is not consolidated on this rank (never, or a "
            "step() came after it). Call consolidate_state_dict(to_rank) on every rank "
            "first, then state_dict() on rank to_rank.");
  return *consolidated_;
}

void ZeroRedundancyOptimizer::load_state_dict(const c10::impl::GenericDict& state) {
  const torch::nn::Module no_names;
  detail::prepare_zero_load(*this, no_names, state,
                            "ZeroRedundancyOptimizer::load_state_dict on rank " +
                                std::to_string(group_->rank()))();
}

namespace detail {
namespace {

// For each rank, the global index of each of its shard's parameters: the shard keeps the
// param groups' order (zero_redundancy_optimizer.cpp), so the j-th parameter of rank r's
// shard is the j-th parameter that rank r owns.
std::vector<std::vector<int64_t>> shard_indices(const std::vector<int>& owners, int world) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(world));
  for (size_t i = 0; i < owners.size(); ++i) {
    out[static_cast<size_t>(owners[i])].push_back(static_cast<int64_t>(i));
  }
  return out;
}

// Rank `src`'s bytes, on every rank (only `src` passes them). Two broadcasts: the
// length, then the bytes.
std::string broadcast_bytes(ProcessGroup& pg, const std::string& bytes, int src) {
  const bool mine = pg.rank() == src;
  const at::Tensor length =
      broadcast_host(pg, at::full({1}, mine ? static_cast<int64_t>(bytes.size()) : 0, at::kLong),
                     src);
  const int64_t n = length.item<int64_t>();
  if (n == 0) return std::string();
  at::Tensor host = at::empty({n}, at::kByte);
  if (mine) std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
  const at::Tensor got = broadcast_host(pg, host, src);
  return std::string(static_cast<const char*>(got.data_ptr()), static_cast<size_t>(n));
}

}  // namespace

// Note [ZeRO state exchange]
// Each rank writes its shard's optimizer state as the wrapped optimizer's own
// state_dict (optimizer_state_dict: indices count the shard's parameters), pickled.
// Rank by rank, that rank broadcasts its bytes and `to_rank` keeps them, so no rank
// holds more than one other shard at a time besides `to_rank`, which ends with all of
// them. `to_rank` then renumbers each shard's state to the parameter's index among
// all parameters, which is what an unsharded optimizer's state_dict uses: the result is
// the state dict that the unsharded optimizer would have had.
std::optional<c10::impl::GenericDict> gather_zero_state(ZeroRedundancyOptimizer& zero,
                                                        int to_rank) {
  ProcessGroup& pg = *zero.process_group();
  const int world = pg.size();
  DDP_CHECK(to_rank >= 0 && to_rank < world, "consolidate_state_dict: to_rank must be in 0..",
            world - 1, ", but got ", to_rank);
  // The hyperparameters saved are param_groups()'s, which may have changed since the
  // last step passed them on.
  for (size_t g = 0; g < zero.param_groups().size(); ++g) {
    zero.local_optimizer().param_groups()[g].set_options(zero.param_groups()[g].options().clone());
  }
  const torch::nn::Module no_names;
  const c10::impl::GenericDict local = optimizer_state_dict(zero.local_optimizer(), no_names);
  const auto indices = shard_indices(zero.owners(), world);
  const std::string where = "consolidate_state_dict on rank " + std::to_string(pg.rank());

  std::map<int64_t, c10::IValue> state;  // ordered by parameter index
  for (int r = 0; r < world; ++r) {
    c10::impl::GenericDict shard = local;
    if (r != to_rank) {
      const std::string bytes =
          broadcast_bytes(pg, pg.rank() == r ? pickle_string(local) : std::string(), r);
      if (pg.rank() != to_rank) continue;
      shard = as_dict(unpickle(bytes, where), "rank " + std::to_string(r) + "'s shard", where);
    } else if (pg.rank() != to_rank) {
      continue;
    }
    const c10::impl::GenericDict shard_state =
        as_dict(get(shard, "state", "a shard", where), "a shard's 'state'", where);
    for (const auto& entry : shard_state) {
      const int64_t j = entry.key().toInt();
      TORCH_INTERNAL_ASSERT(j >= 0 && static_cast<size_t>(j) < indices[r].size(), "rank ", r,
                            " sent state for shard parameter ", j, " of ", indices[r].size());
      state.emplace(indices[r][static_cast<size_t>(j)], entry.value());
    }
  }
  if (pg.rank() != to_rank) return std::nullopt;

  c10::impl::GenericDict full_state(c10::IntType::get(), c10::AnyType::get());
  for (const auto& entry : state) full_state.insert(entry.first, entry.second);
  // This rank's groups carry the hyperparameters; "params" become global indices.
  const c10::impl::GenericList local_groups = local.at("param_groups").toList();
  c10::impl::GenericList groups = new_list();
  c10::impl::GenericList names = new_list();
  int64_t index = 0;
  for (size_t g = 0; g < zero.param_groups().size(); ++g) {
    c10::impl::GenericDict group = local_groups.get(g).toGenericDict().copy();
    c10::List<int64_t> params;
    for (size_t k = 0; k < zero.param_groups()[g].params().size(); ++k) {
      params.push_back(index++);
      names.push_back(std::string());
    }
    group.insert_or_assign("params", params);
    groups.push_back(group);
  }
  c10::impl::GenericDict out = new_dict();
  out.insert("state", full_state);
  out.insert("param_groups", groups);
  out.insert("type", local.at("type"));
  out.insert("param_names", names);
  return out;
}

Apply prepare_zero_load(ZeroRedundancyOptimizer& zero, const torch::nn::Module& model,
                        const c10::IValue& saved, const std::string& where) {
  const c10::impl::GenericDict dict = as_dict(saved, "'optimizer'", where);
  const c10::IValue groups_value = get(dict, "param_groups", "'optimizer'", where);
  DDP_CHECK(groups_value.isList(), where, ": optimizer['param_groups'] should be a list");
  const c10::impl::GenericList groups = groups_value.toList();
  const c10::impl::GenericDict state =
      as_dict(get(dict, "state", "'optimizer'", where), "optimizer['state']", where);
  const auto names_it = dict.find("param_names");
  const c10::impl::GenericList saved_names = names_it != dict.end() && names_it->value().isList()
                                                 ? names_it->value().toList()
                                                 : new_list();
  const auto& mine = zero.param_groups();
  DDP_CHECK(groups.size() == mine.size(), where, ": the saved optimizer has ", groups.size(),
            " param group(s), but this ZeroRedundancyOptimizer has ", mine.size(),
            ". Create it with the same param groups as the run that saved the state.");

  // The saved state restricted to this rank's shard and renumbered as the shard's
  // optimizer counts its parameters; prepare_optimizer_load checks the rest.
  const int rank = zero.process_group()->rank();
  c10::impl::GenericDict shard_state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList shard_groups = new_list();
  c10::impl::GenericList shard_names = new_list();
  size_t global = 0;
  int64_t local = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string what = "param_groups[" + std::to_string(g) + "]";
    c10::impl::GenericDict group = as_dict(groups.get(g), what, where).copy();
    const c10::IValue params_value = get(group, "params", what, where);
    DDP_CHECK(params_value.isList(), where, ": ", what, "['params'] should be a list");
    const c10::impl::GenericList params = params_value.toList();
    const size_t count = mine[g].params().size();
    DDP_CHECK(params.size() == count, where, ": ", what, " has ", params.size(),
              " parameter(s) in the saved state, but ", count,
              " in this ZeroRedundancyOptimizer. Expected the optimizer of the same model.");
    c10::List<int64_t> local_params;
    for (size_t k = 0; k < count; ++k, ++global) {
      DDP_CHECK(params.get(k).isInt(), where, ": ", what, "['params'] should hold ints");
      if (zero.owners()[global] != rank) continue;
      const int64_t saved_index = params.get(k).toInt();
      const auto it = state.find(saved_index);
      if (it != state.end()) shard_state.insert(local, it->value());
      const bool named = saved_index >= 0 &&
                         static_cast<size_t>(saved_index) < saved_names.size() &&
                         saved_names.get(saved_index).isString();
      shard_names.push_back(named ? saved_names.get(saved_index).toStringRef() : std::string());
      local_params.push_back(local++);
    }
    group.insert_or_assign("params", local_params);
    shard_groups.push_back(group);
  }
  c10::impl::GenericDict shard = new_dict();
  shard.insert("state", shard_state);
  shard.insert("param_groups", shard_groups);
  shard.insert("type", get(dict, "type", "'optimizer'", where));
  shard.insert("param_names", shard_names);

  const Apply load_shard = prepare_optimizer_load(zero.local_optimizer(), model, shard, where);
  return [&zero, load_shard] {
    load_shard();
    // The shard's optimizer now has the saved hyperparameters; param_groups() is where
    // they are read and changed.
    for (size_t g = 0; g < zero.param_groups().size(); ++g) {
      zero.param_groups()[g].set_options(
          zero.local_optimizer().param_groups()[g].options().clone());
    }
  };
}

}  // namespace detail
}  // namespace ddp
