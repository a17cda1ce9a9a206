#include "formats/optimizer_state.h"
#include "distributed/common/check.h"

#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <map>
#include <memory>
#include <sstream>
#include <tuple>
#include <type_traits>
#include <utility>

namespace ddp {
namespace detail {

namespace {

// Note [Optimizer state keys]
// LibTorch optimizers keep per-parameter state in a map keyed by the parameter's
// TensorImpl: LibTorch 1.x uses the string c10::guts::to_string(impl) (an ostream of the
// pointer), 2.x the pointer itself (void*). The key type is taken from the map, and the
// overload below that matches it is the only place that knows the difference.
using StateMap = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using StateKey = typename StateMap::key_type;

inline void make_key(std::string& key, c10::TensorImpl* impl) {
  std::ostringstream os;
  os << impl;
  key = os.str();
}
inline void make_key(void*& key, c10::TensorImpl* impl) { key = impl; }

StateKey key_of(const at::Tensor& param) {
  StateKey key{};
  make_key(key, param.unsafeGetTensorImpl());
  return key;
}

enum class OptimizerKind { SGD, Adam, AdamW };

const char* kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::SGD:
      return "SGD";
    case OptimizerKind::Adam:
      return "Adam";
    case OptimizerKind::AdamW:
      return "AdamW";
  }
  return "?";
}

OptimizerKind kind_of(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return OptimizerKind::SGD;
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return OptimizerKind::AdamW;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return OptimizerKind::Adam;
  DDP_CHECK(false, "checkpoints support the optimizers torch::optim::SGD, Adam and AdamW, "
                   "but got another type. Save its state yourself in Checkpoint::extra.");
  return OptimizerKind::SGD;
}

std::map<c10::TensorImpl*, std::string> parameter_names(const torch::nn::Module& model) {
  std::map<c10::TensorImpl*, std::string> names;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    names.emplace(p.value().unsafeGetTensorImpl(), p.key());
  }
  return names;
}

c10::IValue cpu(const at::Tensor& t) { return cpu_copy(t); }

template <typename Options>
void insert_adam_like(const Options& o, c10::impl::GenericDict& g) {
  g.insert("lr", o.lr());
  g.insert("betas", c10::ivalue::Tuple::create(std::get<0>(o.betas()), std::get<1>(o.betas())));
  g.insert("eps", o.eps());
  g.insert("weight_decay", o.weight_decay());
  g.insert("amsgrad", o.amsgrad());
}

// Hyperparameters of one group, named as in Python's param_groups.
c10::impl::GenericDict group_options(OptimizerKind kind,
                                     const torch::optim::OptimizerOptions& base) {
  c10::impl::GenericDict g = new_dict();
  if (kind == OptimizerKind::SGD) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(base);
    g.insert("lr", o.lr());
    g.insert("momentum", o.momentum());
    g.insert("dampening", o.dampening());
    g.insert("weight_decay", o.weight_decay());
    g.insert("nesterov", o.nesterov());
  } else if (kind == OptimizerKind::Adam) {
    insert_adam_like(static_cast<const torch::optim::AdamOptions&>(base), g);
  } else {
    insert_adam_like(static_cast<const torch::optim::AdamWOptions&>(base), g);
  }
  return g;
}

c10::impl::GenericDict param_state(OptimizerKind kind,
                                   const torch::optim::OptimizerParamState& base) {
  c10::impl::GenericDict s = new_dict();
  if (kind == OptimizerKind::SGD) {
    const auto& st = static_cast<const torch::optim::SGDParamState&>(base);
    if (st.momentum_buffer().defined()) s.insert("momentum_buffer", cpu(st.momentum_buffer()));
  } else if (kind == OptimizerKind::Adam) {
    const auto& st = static_cast<const torch::optim::AdamParamState&>(base);
    s.insert("step", st.step());
    s.insert("exp_avg", cpu(st.exp_avg()));
    s.insert("exp_avg_sq", cpu(st.exp_avg_sq()));
    if (st.max_exp_avg_sq().defined()) s.insert("max_exp_avg_sq", cpu(st.max_exp_avg_sq()));
  } else {
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(base);
    s.insert("step", st.step());
    s.insert("exp_avg", cpu(st.exp_avg()));
    s.insert("exp_avg_sq", cpu(st.exp_avg_sq()));
    if (st.max_exp_avg_sq().defined()) s.insert("max_exp_avg_sq", cpu(st.max_exp_avg_sq()));
  }
  return s;
}

}  // namespace

c10::impl::GenericDict optimizer_state_dict(const torch::optim::Optimizer& optimizer,
                                            const torch::nn::Module& model) {
  const OptimizerKind kind = kind_of(optimizer);
  const auto names = parameter_names(model);
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups = new_list();
  c10::impl::GenericList param_names = new_list();
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    c10::impl::GenericDict g = group_options(kind, group.options());
    c10::List<int64_t> params;
    for (const auto& p : group.params()) {
      const auto name = names.find(p.unsafeGetTensorImpl());
      param_names.push_back(name == names.end() ? std::string() : name->second);
      const auto it = optimizer.state().find(key_of(p));
      if (it != optimizer.state().end()) state.insert(index, param_state(kind, *it->second));
      params.push_back(index++);
    }
    g.insert("params", params);
    groups.push_back(g);
  }
  c10::impl::GenericDict out = new_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  out.insert("type", std::string(kind_name(kind)));
  out.insert("param_names", param_names);
  return out;
}

namespace {

// The restore, built during validation (Note [Validate, then apply]).
struct Pending {
  std::vector<std::pair<StateKey, std::unique_ptr<torch::optim::OptimizerParamState>>> state;
  std::vector<c10::impl::GenericDict> groups;
};

struct Loader {
  OptimizerKind kind;
  const std::string& where;

  at::Tensor tensor(const c10::impl::GenericDict& s, const std::string& key,
                    const std::string& what, const at::Tensor& param) const {
    const at::Tensor t = get_tensor(s, key, what, where);
    DDP_CHECK(t.sizes() == param.sizes(), where, ": ", what, "['", key, "'] has shape ",
              shape_string(t), " in the checkpoint, but the parameter has shape ",
              shape_string(param),
              ". Expected the optimizer of the same model, with parameters in the same "
              "order.");
    return t.to(param.options()).clone();
  }

  std::unique_ptr<torch::optim::OptimizerParamState> state(
      const c10::impl::GenericDict& s, const std::string& what, const at::Tensor& param,
      const c10::impl::GenericDict& group) const {
    if (kind == OptimizerKind::SGD) {
      auto st = std::make_unique<torch::optim::SGDParamState>();
      st->momentum_buffer(tensor(s, "momentum_buffer", what, param));
      return st;
    }
    // Python 1.12+ saves Adam's step as a float tensor; this file saves an int.
    const c10::IValue step = get(s, "step", what, where);
    DDP_CHECK(step.isInt() || (step.isTensor() && step.toTensor().numel() == 1), where, ": ", what,
              "['step'] should be an int, but is ", step.tagKind());
    const int64_t steps =
        step.isInt() ? step.toInt() : static_cast<int64_t>(step.toTensor().item<double>());
    const bool amsgrad = get_bool(group, "amsgrad", "a param group", where);
    auto fill = [&](auto& st) {
      st.step(steps);
      st.exp_avg(tensor(s, "exp_avg", what, param));
      st.exp_avg_sq(tensor(s, "exp_avg_sq", what, param));
      if (amsgrad) st.max_exp_avg_sq(tensor(s, "max_exp_avg_sq", what, param));
    };
    if (kind == OptimizerKind::Adam) {
      auto st = std::make_unique<torch::optim::AdamParamState>();
      fill(*st);
      return st;
    }
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    fill(*st);
    return st;
  }

  // Reads every hyperparameter now, so that apply cannot fail on a missing one.
  void check_group(const c10::impl::GenericDict& g, size_t index) const {
    const std::string what = "param_groups[" + std::to_string(index) + "]";
    get_double(g, "lr", what, where);
    get_double(g, "weight_decay", what, where);
    if (kind == OptimizerKind::SGD) {
      get_double(g, "momentum", what, where);
      get_double(g, "dampening", what, where);
      get_bool(g, "nesterov", what, where);
    } else {
      const c10::IValue betas = get(g, "betas", what, where);
      DDP_CHECK(betas.isTuple() && betas.toTupleRef().elements().size() == 2, where, ": ", what,
                "['betas'] should be a pair of floats, but is ", betas.tagKind());
      for (const auto& b : betas.toTupleRef().elements()) {
        DDP_CHECK(b.isDouble() || b.isInt(), where, ": ", what,
                  "['betas'] should hold floats, but holds ", b.tagKind());
      }
      get_double(g, "eps", what, where);
      get_bool(g, "amsgrad", what, where);
    }
  }
};

double as_double(const c10::IValue& v) {
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

template <typename Options>
void set_adam_like(Options& o, const c10::impl::GenericDict& g) {
  const auto& betas = g.at("betas").toTupleRef().elements();
  o.lr(as_double(g.at("lr")));
  o.betas(std::make_tuple(as_double(betas[0]), as_double(betas[1])));
  o.eps(as_double(g.at("eps")));
  o.weight_decay(as_double(g.at("weight_decay")));
  o.amsgrad(g.at("amsgrad").toBool());
}

void set_group(OptimizerKind kind, torch::optim::OptimizerOptions& base,
               const c10::impl::GenericDict& g) {
  if (kind == OptimizerKind::SGD) {
    auto& o = static_cast<torch::optim::SGDOptions&>(base);
    o.lr(as_double(g.at("lr")));
    o.momentum(as_double(g.at("momentum")));
    o.dampening(as_double(g.at("dampening")));
    o.weight_decay(as_double(g.at("weight_decay")));
    o.nesterov(g.at("nesterov").toBool());
  } else if (kind == OptimizerKind::Adam) {
    set_adam_like(static_cast<torch::optim::AdamOptions&>(base), g);
  } else {
    set_adam_like(static_cast<torch::optim::AdamWOptions&>(base), g);
  }
}

}  // namespace

Apply prepare_optimizer_load(torch::optim::Optimizer& optimizer, const torch::nn::Module& model,
                             const c10::IValue& saved, const std::string& where) {
  const OptimizerKind kind = kind_of(optimizer);
  const c10::impl::GenericDict dict = as_dict(saved, "'optimizer'", where);
  const c10::IValue type = get(dict, "type", "'optimizer'", where);
  DDP_CHECK(type.isString() && type.toStringRef() == kind_name(kind), where,
            ": the checkpoint holds ", type.isString() ? type.toStringRef() : "unknown",
            " optimizer state, but the optimizer is ", kind_name(kind),
            ". Create the same optimizer type as the run that saved it.");
  const c10::IValue groups_value = get(dict, "param_groups", "'optimizer'", where);
  DDP_CHECK(groups_value.isList(), where, ": optimizer['param_groups'] should be a list");
  const c10::impl::GenericList groups = groups_value.toList();
  const c10::impl::GenericDict state =
      as_dict(get(dict, "state", "'optimizer'", where), "optimizer['state']", where);
  const c10::IValue names_value = get(dict, "param_names", "'optimizer'", where);
  DDP_CHECK(names_value.isList(), where, ": optimizer['param_names'] should be a list");
  const c10::impl::GenericList saved_names = names_value.toList();
  const auto names = parameter_names(model);

  const auto& my_groups = optimizer.param_groups();
  DDP_CHECK(groups.size() == my_groups.size(), where, ": the checkpoint's optimizer has ",
            groups.size(), " param group(s), but this optimizer has ", my_groups.size(),
            ". Create the optimizer with the same param groups as the run that saved it.");

  const Loader loader{kind, where};
  auto pending = std::make_shared<Pending>();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const std::string what = "param_groups[" + std::to_string(gi) + "]";
    const c10::impl::GenericDict g = as_dict(groups.get(gi), what, where);
    loader.check_group(g, gi);
    const c10::IValue params_value = get(g, "params", what, where);
    DDP_CHECK(params_value.isList(), where, ": ", what, "['params'] should be a list");
    const c10::impl::GenericList params = params_value.toList();
    const auto& mine = my_groups[gi].params();
    DDP_CHECK(params.size() == mine.size(), where, ": ", what, " has ", params.size(),
              " parameter(s) in the checkpoint, but ", mine.size(),
              " in this optimizer. Expected the optimizer of the same model.");
    for (size_t j = 0; j < mine.size(); ++j) {
      DDP_CHECK(params.get(j).isInt(), where, ": ", what, "['params'] should hold ints");
      const int64_t index = params.get(j).toInt();
      const auto mine_name = names.find(mine[j].unsafeGetTensorImpl());
      const std::string name = mine_name == names.end() ? "" : mine_name->second;
      if (index >= 0 && static_cast<size_t>(index) < saved_names.size() &&
          saved_names.get(index).isString() && !name.empty()) {
        const std::string& saved_name = saved_names.get(index).toStringRef();
        DDP_CHECK(saved_name.empty() || saved_name == name, where, ": optimizer parameter ", index,
                  " is '", saved_name, "' in the checkpoint but '", name,
                  "' in this optimizer. Expected the parameters in the same order.");
      }
      const auto it = state.find(index);
      if (it == state.end()) continue;
      const std::string what_state = "optimizer['state'][" + std::to_string(index) + "]" +
                                     (name.empty() ? "" : " ('" + name + "')");
      const c10::impl::GenericDict s = as_dict(it->value(), what_state, where);
      pending->state.emplace_back(key_of(mine[j]), loader.state(s, what_state, mine[j], g));
    }
    pending->groups.push_back(g);
  }
  return [&optimizer, kind, pending] {
    for (size_t gi = 0; gi < pending->groups.size(); ++gi) {
      set_group(kind, optimizer.param_groups()[gi].options(), pending->groups[gi]);
    }
    optimizer.state().clear();
    for (auto& entry : pending->state) {
      optimizer.state()[entry.first] = std::move(entry.second);
    }
  };
}

}  // namespace detail
}  // namespace ddp
