// ddp::parallelize_module and the styles (include/ddp/parallel/tensor_parallel.h).
//
// Note [Tensor-parallel forward]
// With the weights split as the style says (each rank keeps its chunk, torch.chunk's rule,
// Note [Uneven shards]), the forward of a styled module is, on local tensors:
//   ColwiseParallel Linear:   x -> [all-gather along d if input Shard(d)] -> copy_to
//                             (backward: sum of the input's gradient) -> linear with the
//                             rank's rows -> [gather_from along -1 if output Replicate]
//   ColwiseParallel Embedding: indices -> embedding with the rank's columns -> [gather]
//   RowwiseParallel Linear:   x -> [split_to along -1 if input Replicate] -> linear with
//                             the rank's columns, no bias -> reduce_from (all-reduce), or
//                             reduce_scatter_to along d for output Shard(d) -> + bias
//   RowwiseParallel Embedding: indices -> the rank's rows looked up (others zero) ->
//                             reduce_from or reduce_scatter_to
//   SequenceParallel:         the module on the rank's slice of the sequence
// Parameters that stay whole on every rank get the same gradient on every rank, except
// where a rank saw only part of the sequence (a SequenceParallel module's, a
// RowwiseParallel bias under output Shard(d)): those gradients are summed over the group
// by a hook on the parameter, so every rank steps them alike.

#include <ddp/parallel/tensor_parallel.h>

#include "distributed/common/check.h"
#include "modules/module_tree.h"
#include "tensor_parallel/tp_comm.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <mutex>
#include <unordered_map>

namespace ddp {
namespace detail {

struct TensorParallelState {
  ParallelStyle style;
  std::shared_ptr<ProcessGroup> group;
  std::string path;
  torch::nn::LinearImpl* linear = nullptr;
  torch::nn::EmbeddingImpl* embedding = nullptr;
  /// Every rank's length along the split dimension of the weight.
  std::vector<int64_t> sizes;
  /// This rank's first index there.
  int64_t offset = 0;
  std::vector<at::Tensor> registered;  // parameters in the shard registry
  ~TensorParallelState();
};

namespace {

std::mutex registry_mutex;
std::unordered_map<const c10::TensorImpl*, TensorParallelShard>& registry() {
  static auto* r = new std::unordered_map<const c10::TensorImpl*, TensorParallelShard>();
  return *r;
}

void register_shard(TensorParallelState& state, const at::Tensor& param,
                    TensorParallelShard shard) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry()[param.unsafeGetTensorImpl()] = std::move(shard);
  state.registered.push_back(param);
}

const char* style_name(const ParallelStyle& style) {
  if (std::holds_alternative<ColwiseParallel>(style)) return "ColwiseParallel";
  if (std::holds_alternative<RowwiseParallel>(style)) return "RowwiseParallel";
  return "SequenceParallel";
}

// The rank's chunk of `full` along `dim` (a copy).
at::Tensor chunk_of(const at::Tensor& full, int64_t dim, int64_t n, int64_t r) {
  const int64_t total = full.size(dim);
  return full.narrow(dim, tp::chunk_offset(total, n, r), tp::chunk_sizes(total, n)[r]).clone();
}

// Splits `param` along `dim` in place (set_data keeps the tensor the module and its
// registry hold) and records it.
void split_param(TensorParallelState& state, at::Tensor& param, int64_t dim) {
  const int64_t n = state.group->size();
  const int64_t r = state.group->rank();
  TensorParallelShard shard;
  shard.group = state.group;
  shard.dim = dim;
  shard.full_size = param.sizes().vec();
  shard.offset = tp::chunk_offset(param.size(dim), n, r);
  {
    at::NoGradGuard no_grad;
    param.set_data(chunk_of(param.detach(), dim, n, r));
  }
  register_shard(state, param, std::move(shard));
}

// Sums the parameter's gradient over the group in backward (Note [Tensor-parallel
// forward]).
void sum_gradient(const at::Tensor& param, std::shared_ptr<ProcessGroup> group) {
  if (!param.defined() || !param.requires_grad()) return;
  param.register_hook([group](const at::Tensor& grad) {
    at::Tensor sum = grad.contiguous().clone();
    group->all_reduce(sum, ReduceOp::SUM);
    return sum;
  });
}

bool fnmatch_part(const std::string& pattern, const std::string& text) {
  // '*' any run, '?' one character; iterative with backtracking.
  size_t p = 0, t = 0, star = std::string::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

bool path_matches(const std::string& pattern, const std::string& path) {
  const std::vector<std::string> p = split_path(pattern), t = split_path(path);
  if (p.size() != t.size()) return false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (!fnmatch_part(p[i], t[i])) return false;
  }
  return true;
}

// A TensorParallelImpl<M> around `m` if it is an M (and `any` holding it); else nullptr.
template <typename M>
std::shared_ptr<TensorParallelBase> wrap_as(const std::shared_ptr<torch::nn::Module>& m,
                                            torch::nn::AnyModule* any) {
  auto typed = std::dynamic_pointer_cast<M>(m);
  if (!typed) return nullptr;
  auto w = std::make_shared<TensorParallelImpl<M>>(typed);
  *any = torch::nn::AnyModule(w);
  return w;
}

std::shared_ptr<TensorParallelBase> make_wrapper(const std::shared_ptr<torch::nn::Module>& m,
                                                 torch::nn::AnyModule* any) {
  for (auto wrap : {wrap_as<torch::nn::LinearImpl>, wrap_as<torch::nn::EmbeddingImpl>,
                    wrap_as<torch::nn::LayerNormImpl>, wrap_as<torch::nn::DropoutImpl>}) {
    if (auto w = wrap(m, any)) return w;
  }
  return nullptr;
}

}  // namespace

TensorParallelState::~TensorParallelState() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (const at::Tensor& p : registered) registry().erase(p.unsafeGetTensorImpl());
}

}  // namespace detail

std::string Placement::str() const {
  return shard_ ? "Shard(" + std::to_string(dim_) + ")" : "Replicate()";
}

TensorParallelBase::TensorParallelBase(std::shared_ptr<torch::nn::Module> module)
    : torch::nn::Module("TensorParallel"), module_(std::move(module)) {
  detail::adopt_members(*this, *module_);
}

std::shared_ptr<ProcessGroup> TensorParallelBase::group() const {
  return state_ ? state_->group : nullptr;
}

void TensorParallelBase::train(bool on) {
  torch::nn::Module::train(on);
  module_->train(on);
}

void TensorParallelBase::apply(const ParallelStyle& style, std::shared_ptr<ProcessGroup> group,
                               const std::string& path) {
  using detail::TensorParallelState;
  DDP_CHECK(group != nullptr, "ddp::parallelize_module: '", path, "': no group");
  DDP_CHECK(state_ == nullptr, "ddp::parallelize_module: '", path, "' already has ",
            detail::style_name(state_ ? state_->style : style),
            "; a module takes one style. Name it once in the plan.");
  auto state = std::make_shared<TensorParallelState>();
  state->style = style;
  state->group = std::move(group);
  state->path = path;
  state->linear = dynamic_cast<torch::nn::LinearImpl*>(module_.get());
  state->embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(module_.get());
  const int64_t n = state->group->size();
  const int64_t r = state->group->rank();
  const char* name = detail::style_name(style);

  auto check_local = [&](bool use_local_output) {
    DDP_CHECK(use_local_output, "ddp::parallelize_module: '", path, "': ", name,
              "().use_local_output(false) asks for a DTensor output; ddp-cpp's outputs are "
              "plain tensors laid out as output_layouts says. Leave use_local_output true.");
  };
  if (const auto* col = std::get_if<ColwiseParallel>(&style)) {
    check_local(col->use_local_output());
    DDP_CHECK(col->output_layouts().is_replicate() || col->output_layouts() == Shard(-1),
              "ddp::parallelize_module: '", path,
              "': ColwiseParallel's output is the rank's slice of the last dimension "
              "(Shard(-1)) or whole (Replicate()), but output_layouts is ",
              col->output_layouts().str(), ".");
    if (state->linear) {
      state->sizes = detail::tp::chunk_sizes(state->linear->weight.size(0), n);
      state->offset = detail::tp::chunk_offset(state->linear->weight.size(0), n, r);
      detail::split_param(*state, state->linear->weight, 0);
      if (state->linear->bias.defined()) detail::split_param(*state, state->linear->bias, 0);
    } else if (state->embedding) {
      DDP_CHECK(col->input_layouts().is_replicate(), "ddp::parallelize_module: '", path,
                "': an Embedding's indices are whole (Replicate()), but input_layouts is ",
                col->input_layouts().str(), ".");
      state->sizes = detail::tp::chunk_sizes(state->embedding->weight.size(1), n);
      state->offset = detail::tp::chunk_offset(state->embedding->weight.size(1), n, r);
      detail::split_param(*state, state->embedding->weight, 1);
    } else {
      DDP_CHECK(false, "ddp::parallelize_module: '", path, "' is a ", module_->name(),
                "; ColwiseParallel splits a torch::nn::Linear or torch::nn::Embedding.");
    }
  } else if (const auto* row = std::get_if<RowwiseParallel>(&style)) {
    check_local(row->use_local_output());
    if (state->linear) {
      DDP_CHECK(row->input_layouts().is_replicate() || row->input_layouts() == Shard(-1),
                "ddp::parallelize_module: '", path,
                "': RowwiseParallel's input is the rank's slice of the last dimension "
                "(Shard(-1)) or whole (Replicate()), but input_layouts is ",
                row->input_layouts().str(), ".");
      state->sizes = detail::tp::chunk_sizes(state->linear->weight.size(1), n);
      state->offset = detail::tp::chunk_offset(state->linear->weight.size(1), n, r);
      detail::split_param(*state, state->linear->weight, 1);
      if (row->output_layouts().is_shard()) {
        detail::sum_gradient(state->linear->bias, state->group);
      }
    } else if (state->embedding) {
      const auto& o = state->embedding->options;
      DDP_CHECK(!o.max_norm().has_value(), "ddp::parallelize_module: '", path,
                "': RowwiseParallel on an Embedding with max_norm is not supported (the "
                "renormalisation needs whole rows).");
      state->sizes = detail::tp::chunk_sizes(state->embedding->weight.size(0), n);
      state->offset = detail::tp::chunk_offset(state->embedding->weight.size(0), n, r);
      detail::split_param(*state, state->embedding->weight, 0);
    } else {
      DDP_CHECK(false, "ddp::parallelize_module: '", path, "' is a ", module_->name(),
                "; RowwiseParallel splits a torch::nn::Linear or torch::nn::Embedding.");
    }
  } else {
    const auto& seq = std::get<SequenceParallel>(style);
    check_local(seq.use_local_output());
    for (auto& p : module_->parameters(/*recurse=*/true)) {
      detail::sum_gradient(p, state->group);
    }
  }
  state_ = std::move(state);
}

at::Tensor TensorParallelBase::run(const at::Tensor& input,
                                   const std::function<at::Tensor(const at::Tensor&)>& call) const {
  if (!state_) return call(input);
  namespace tp = detail::tp;
  const auto& s = *state_;
  const std::shared_ptr<ProcessGroup>& g = s.group;
  const auto input_dim = [&](const Placement& p) {
    DDP_CHECK(input.dim() > 0, "ddp::parallelize_module: '", s.path,
              "' got a 0-dimensional input; expected a batch.");
    return p.dim() < 0 ? p.dim() + input.dim() : p.dim();
  };
  if (const auto* col = std::get_if<ColwiseParallel>(&s.style)) {
    at::Tensor out;
    if (s.linear) {
      at::Tensor x = input;
      if (col->input_layouts().is_shard()) {
        const int64_t d = input_dim(col->input_layouts());
        x = tp::all_gather_to(x, d, tp::exchange_sizes(*g, x, d), g);
      } else {
        x = tp::copy_to(x, g);
      }
      out = call(x);
    } else {
      out = call(input);  // indices: no gradient
    }
    if (col->output_layouts().is_replicate()) {
      out = tp::gather_from(out, -1, s.sizes, g);
    }
    return out;
  }
  if (const auto* row = std::get_if<RowwiseParallel>(&s.style)) {
    at::Tensor partial;
    if (s.linear) {
      at::Tensor x = input;
      if (row->input_layouts().is_replicate()) {
        x = tp::split_to(x, -1, s.sizes, g);
      } else {
        const int64_t mine = s.sizes[static_cast<size_t>(g->rank())];
        DDP_CHECK(x.size(-1) == mine, "ddp::parallelize_module: '", s.path,
                  "' (RowwiseParallel, input Shard(-1)) expected this rank's ", mine, " of the ",
                  s.linear->options.in_features(),
                  " input features in the last dimension, but got shape ", x.sizes(), " on rank ",
                  g->rank(),
                  ". Feed it a ColwiseParallel layer's output, or give input_layouts("
                  "ddp::Replicate()) for a whole input.");
      }
      partial = at::linear(x, s.linear->weight);
    } else {
      const at::Tensor& weight = s.embedding->weight;
      const int64_t rows = weight.size(0);
      const at::Tensor outside = (input < s.offset) | (input >= s.offset + rows);
      const at::Tensor local = (input - s.offset).masked_fill(outside, 0);
      const auto& o = s.embedding->options;
      int64_t padding = -1;
      if (o.padding_idx().has_value()) {
        const int64_t p = *o.padding_idx();
        const int64_t full = p < 0 ? p + o.num_embeddings() : p;
        padding = (full >= s.offset && full < s.offset + rows) ? full - s.offset : -1;
      }
      partial = rows == 0
                    ? at::zeros(
                          [&] {
                            std::vector<int64_t> shape = input.sizes().vec();
                            shape.push_back(weight.size(1));
                            return shape;
                          }(),
                          weight.options())
                    : at::embedding(weight, local, padding, o.scale_grad_by_freq(), o.sparse());
      partial = partial * outside.logical_not().unsqueeze(-1).to(partial.scalar_type());
    }
    at::Tensor out;
    if (row->output_layouts().is_replicate()) {
      out = tp::reduce_from(partial, g);
    } else {
      const int64_t d = row->output_layouts().dim() < 0
                            ? row->output_layouts().dim() + partial.dim()
                            : row->output_layouts().dim();
      out = tp::reduce_scatter_to(partial, d, tp::chunk_sizes(partial.size(d), g->size()), g);
    }
    if (s.linear && s.linear->bias.defined()) out = out + s.linear->bias;
    return out;
  }
  return call(input);  // SequenceParallel: the rank's slice in, the rank's slice out
}

namespace {

struct Target {
  std::string path;
  std::shared_ptr<torch::nn::Module> module;
  const ParallelStyle* style;
};

}  // namespace

torch::nn::Module& parallelize_module(torch::nn::Module& module,
                                      std::shared_ptr<ProcessGroup> group,
                                      const ParallelizePlan& plan) {
  DDP_CHECK(group != nullptr, "ddp::parallelize_module: the group is null; pass the "
                              "tensor-parallel group (or a DeviceMesh).");
  // Which module each entry names, checked before anything changes.
  std::vector<Target> targets;
  std::unordered_map<const torch::nn::Module*, std::string> named;
  {
    const auto modules = module.named_modules("", /*include_self=*/false);
    for (const auto& [pattern, style] : plan) {
      size_t hits = 0;
      for (const auto& item : modules) {
        if (!detail::path_matches(pattern, item.key())) continue;
        ++hits;
        const torch::nn::Module* m = item.value().get();
        const auto seen = named.find(m);
        DDP_CHECK(seen == named.end(), "ddp::parallelize_module: '", item.key(),
                  "' is named by the plan twice ('", seen == named.end() ? "" : seen->second,
                  "' and '", pattern, "'); a module takes one style.");
        named[m] = pattern;
        targets.push_back(Target{item.key(), item.value(), &style});
      }
      DDP_CHECK(hits > 0, "ddp::parallelize_module: the plan's entry '", pattern,
                "' matches no submodule. Paths are as named_modules() spells them, relative "
                "to the module given (e.g. 'blocks.0.mlp.fc', or 'blocks.*.mlp.fc').");
    }
  }  // `modules` held a reference to each module: gone before the references are counted
  // Modules that are not wrappers yet take a wrapper's place where the tree holds them.
  const detail::TreeSurvey survey =
      detail::survey_tree(module,
                          [&](const torch::nn::Module& child) { return named.count(&child) > 0; });
  struct Swap {
    const detail::ChildSite* site;
    std::shared_ptr<TensorParallelBase> wrapper;
    torch::nn::AnyModule any;
  };
  std::vector<Swap> swaps;
  std::unordered_map<const torch::nn::Module*, std::shared_ptr<TensorParallelBase>> wrappers;
  for (const Target& t : targets) {
    if (auto w = std::dynamic_pointer_cast<TensorParallelBase>(t.module)) {
      DDP_CHECK(!w->is_parallel(), "ddp::parallelize_module: '", t.path,
                "' already has a style; a module takes one.");
      wrappers[t.module.get()] = w;
      continue;
    }
    torch::nn::AnyModule any;
    auto w = detail::make_wrapper(t.module, &any);
    DDP_CHECK(w != nullptr, "ddp::parallelize_module: '", t.path, "' is a ", t.module->name(),
              "; a styled module must be a torch::nn::Linear, Embedding, LayerNorm or "
              "Dropout, or be declared as a ddp::TensorParallel<M> field.");
    // The tree's references, ours (t.module and `w`'s two), and nothing else.
    const long outside = survey.outside(t.module, /*own=*/2);
    DDP_CHECK(outside <= 0, "ddp::parallelize_module: '", t.path,
              "' is held by a typed field of its parent (", t.module->name(),
              "), which a wrapper cannot take the place of. Declare the field as "
              "ddp::TensorParallel<",
              t.module->name(),
              "> (a plain pass-through until a plan names it), or hold the module in a "
              "container (Sequential, ModuleList, ModuleDict). Nothing was changed.");
    wrappers[t.module.get()] = w;
    swaps.push_back(Swap{nullptr, w, std::move(any)});
    for (const auto& site : survey.sites) {
      if (site.child == t.module.get()) swaps.back().site = &site;
    }
    DDP_CHECK(swaps.back().site != nullptr, "ddp::parallelize_module: '", t.path,
              "' was not found in the module tree.");
  }
  for (const Swap& s : swaps) {
    detail::replace_child(*s.site->parent, s.site->name, s.site->child, s.wrapper, s.any);
  }
  for (const Target& t : targets) wrappers.at(t.module.get())->apply(*t.style, group, t.path);
  return module;
}

torch::nn::Module& parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh,
                                      const ParallelizePlan& plan) {
  DDP_CHECK(mesh.ndim() == 1, "ddp::parallelize_module: the mesh has ", mesh.ndim(),
            " dimensions; pass the tensor-parallel one, e.g. mesh[\"tp\"].");
  return parallelize_module(module, mesh.get_group(0), plan);
}

std::optional<TensorParallelShard> tensor_parallel_shard(const at::Tensor& parameter) {
  std::lock_guard<std::mutex> lock(detail::registry_mutex);
  const auto it = detail::registry().find(parameter.unsafeGetTensorImpl());
  if (it == detail::registry().end()) return std::nullopt;
  return it->second;
}

}  // namespace ddp
