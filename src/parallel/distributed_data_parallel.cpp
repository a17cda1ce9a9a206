#include <ddp/parallel/distributed_data_parallel.h>

#include <ddp/algorithms/activation_checkpoint.h>

#include <ddp/errors.h>

#include "distributed/common/check.h"
#include "distributed/comm.h"
#include "parallel/bucket_assignment.h"
#include "parallel/clock.h"
#include "algorithms/join_context.h"
#include "parallel/model_check.h"
#include "modules/param_owners.h"
#include "parallel/module_sync.h"
#include "parallel/reducer.h"
#include "parallel/trace_writer.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/modules/embedding.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_set>

namespace ddp {

struct DistributedDataParallelBase::State {
  DistributedDataParallelOptions options;
  std::shared_ptr<ProcessGroup> pg;
  std::vector<std::string> reduced_names;
  std::vector<at::Tensor> buffers;
  std::vector<at::Tensor> state_tensors;  // every parameter and buffer, for broadcasts
  std::vector<std::pair<std::string, at::Tensor>> named_parameters;
  // Debug mode (DDP_DEBUG=detail): parameter checksums every debug_check_every forwards.
  bool debug = false;
  int debug_check_every = 0;
  int64_t debug_forwards = 0;
  bool sync_buffers = false;
  // Inside ddp::join (see Note [Join rounds]).
  std::shared_ptr<detail::JoinContext> join;
  bool join_notifier = false;
  bool shadowing = false;
  std::shared_ptr<detail::Reducer> reducer;
  std::shared_ptr<detail::TraceWriter> trace;
  int64_t forward_start_ns = 0;
};

namespace {

std::shared_ptr<ProcessGroup> resolve_group(const DistributedDataParallelOptions& options) {
  if (options.process_group()) return options.process_group();
  DDP_CHECK(is_initialized(),
            "DistributedDataParallel needs a process group, but the "
            "default one is not initialised and DistributedDataParallelOptions::"
            "process_group is not set. Call ddp::init_process_group() (or create a "
            "ddp::ProcessGroupGuard) before constructing DistributedDataParallel, or pass "
            "a group with DistributedDataParallelOptions().process_group(pg).");
  return default_group();
}

void validate(const DistributedDataParallelOptions& o, int rank) {
  DDP_CHECK(std::isfinite(o.bucket_cap_mb()) && o.bucket_cap_mb() > 0,
            "DistributedDataParallelOptions::bucket_cap_mb must be > 0, but got ",
            o.bucket_cap_mb(), " (rank ", rank, ")");
  DDP_CHECK(o.device_ids().size() <= 1,
            "DistributedDataParallelOptions::device_ids must "
            "name at most one device (this process's), but got ",
            o.device_ids().size(), " entries: ", at::IntArrayRef(o.device_ids()), " (rank ", rank,
            "). DDP drives one device per process: pass {local_rank}, or leave it empty for "
            "a CPU module.");
  for (int64_t id : o.device_ids()) {
    DDP_CHECK(id >= 0, "DistributedDataParallelOptions::device_ids must be >= 0, but got ", id,
              " (rank ", rank, ")");
  }
}

void check_device(const DistributedDataParallelOptions& o, const std::string& name,
                  const at::Tensor& p, int rank) {
  if (o.device_ids().empty()) return;
  const int64_t id = o.device_ids()[0];
  DDP_CHECK(!p.device().is_cpu() && p.device().index() == id,
            "DistributedDataParallel "
            "on rank ",
            rank, ": device_ids is {", id, "}, but parameter '", name, "' is on ", p.device(),
            ". DDP does not move the module: move it first "
            "(model->to(device)), or leave device_ids empty for a CPU module.");
}

// What DDP cannot reduce is refused here, on every rank, before any collective.
void check_leaf(const std::string& name, const at::Tensor& p, const std::string& where) {
  DDP_CHECK(p.is_leaf(), "DistributedDataParallel ", where, ": parameter '", name,
            "' is not a leaf tensor: it was computed by ",
            p.grad_fn() ? p.grad_fn()->name() : std::string("an operation"),
            ", so autograd never accumulates a gradient into it and DDP cannot average "
            "one. Register a leaf instead (e.g. register_parameter(name, t.detach()) and "
            "compute the derived tensor inside forward).");
}

// Embedding and EmbeddingBag with sparse=true produce sparse gradients, which DDP does
// not reduce; say so now rather than at the first backward.
void check_no_sparse_gradients(torch::nn::Module& module, const std::string& where) {
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const at::Tensor* weight = nullptr;
    if (auto* e = dynamic_cast<torch::nn::EmbeddingImpl*>(item.value().get())) {
      if (e->options.sparse()) weight = &e->weight;
    } else if (auto* b = dynamic_cast<torch::nn::EmbeddingBagImpl*>(item.value().get())) {
      if (b->options.sparse()) weight = &b->weight;
    }
    if (weight == nullptr || !weight->defined() || !weight->requires_grad()) continue;
    const std::string name = item.key().empty() ? "weight" : item.key() + ".weight";
    DDP_CHECK(false, "DistributedDataParallel ", where, ": parameter '", name,
              "' belongs to an embedding with sparse=true, whose gradients are sparse; "
              "DDP averages dense gradients only. Construct the embedding with "
              "sparse(false), or freeze it (requires_grad(false)) before wrapping.");
  }
}

std::string format_double(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

DistributedDataParallelBase::DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                                                         DistributedDataParallelOptions options)
    : torch::nn::Module("DistributedDataParallel"), state_(std::make_unique<State>()) {
  State& s = *state_;
  s.pg = resolve_group(options);
  const int rank = s.pg->rank();
  validate(options, rank);
  s.options = std::move(options);
  register_module("module", module);

  // Every parameter (frozen ones too) is checked and broadcast; those that require
  // grad, each tensor once, are reduced.
  detail::ModelDescription description;
  std::vector<at::Tensor> state_tensors;
  std::vector<at::Tensor> reduced;
  std::unordered_set<const void*> seen;
  const std::string where =
      "on rank " + std::to_string(rank) + " of " + std::to_string(s.pg->size());
  check_no_sparse_gradients(*module, where);
  for (const auto& item : module->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    if (detail::ShardOwner* unit = detail::shard_owner_of(p)) {
      DDP_CHECK(false, "DistributedDataParallel ", where, ": parameter '", item.key(),
                "' is sharded by ddp::fully_shard (the unit of ", unit->name(),
                "). A parameter is either replicated by DDP or sharded by fully_shard, not "
                "both: train the sharded model without the DDP wrapper (fully_shard already "
                "reduces its gradients).");
    }
    description.parameters.emplace_back(item.key(), p);
    state_tensors.push_back(p);
    if (!p.requires_grad()) continue;
    check_leaf(item.key(), p, where);
    check_device(s.options, item.key(), p, rank);
    reduced.push_back(p);
    s.reduced_names.push_back(item.key());
  }
  for (const auto& item : module->named_buffers(/*recurse=*/true)) {
    if (!item.value().defined()) continue;
    description.buffers.emplace_back(item.key(), item.value());
    state_tensors.push_back(item.value());
    s.buffers.push_back(item.value());
  }
  const auto& o = s.options;
  description.options = {{"bucket_cap_mb", format_double(o.bucket_cap_mb())},
                         {"broadcast_buffers", o.broadcast_buffers() ? "true" : "false"},
                         {"find_unused_parameters", o.find_unused_parameters() ? "true" : "false"},
                         {"gradient_as_bucket_view",
                          o.gradient_as_bucket_view() ? "true" : "false"},
                         {"static_graph", o.static_graph() ? "true" : "false"}};

  detail::verify_model_across_ranks(*s.pg, description);
  s.named_parameters = description.parameters;
  for (const auto& item : s.named_parameters) detail::mark_ddp_param(item.second, true);
  s.debug = detail::comm_of(*s.pg).config().debug_detail;
  s.debug_check_every = detail::comm_of(*s.pg).config().debug_check_every;
  DDP_CHECK(!reduced.empty(), "DistributedDataParallel on rank ", rank,
            ": the wrapped "
            "module has no parameters that require grad (",
            description.parameters.size(),
            " parameters, all frozen or none at all), so there is nothing to average. "
            "Train it without DDP, or set requires_grad(true) on the parameters to train.");
  // Everyone starts from rank 0's weights and buffers.
  detail::broadcast_coalesced(*s.pg, state_tensors, /*src=*/0);
  s.state_tensors = std::move(state_tensors);

  if (!o.trace_path().empty()) {
    s.trace =
        std::make_shared<detail::TraceWriter>(detail::trace_file_for_rank(o.trace_path(), rank),
                                              rank);
    s.trace->name_track(detail::kMainTrack, "ddp");
    s.trace->name_track(detail::kUserTrack, "user");
    s.trace->flush();
  }

  detail::ReducerOptions ro;
  ro.bucket_cap_bytes = static_cast<size_t>(o.bucket_cap_mb() * 1024.0 * 1024.0);
  ro.bucket_cap_bytes = std::max<size_t>(ro.bucket_cap_bytes, 1);
  ro.first_bucket_cap_bytes = std::min<size_t>(1024 * 1024, ro.bucket_cap_bytes);
  ro.find_unused_parameters = o.find_unused_parameters();
  ro.gradient_as_bucket_view = o.gradient_as_bucket_view();
  ro.static_graph = o.static_graph();
  // World size 1 has the same reducer (hooks, checks, comm hooks); only the exchange
  // is skipped, by the comm (Note [World size 1]; docs/ddp.md, "World size 1").
  s.sync_buffers = o.broadcast_buffers() && !s.buffers.empty();
  s.reducer = detail::Reducer::create(std::move(reduced), s.reduced_names, s.pg, ro, s.trace);
}

DistributedDataParallelBase::~DistributedDataParallelBase() {
  if (!state_) return;
  for (const auto& item : state_->named_parameters) detail::mark_ddp_param(item.second, false);
}

const DistributedDataParallelOptions& DistributedDataParallelBase::options() const {
  return state_->options;
}

ProcessGroup& DistributedDataParallelBase::process_group() const { return *state_->pg; }

const std::vector<std::string>& DistributedDataParallelBase::reduced_parameter_names() const {
  return state_->reduced_names;
}

std::vector<std::vector<size_t>> DistributedDataParallelBase::bucket_indices() const {
  return state_->reducer->bucket_indices();
}

IterationStats DistributedDataParallelBase::last_iteration_stats() const {
  return state_->reducer->last_stats();
}

void DistributedDataParallelBase::register_comm_hook(std::shared_ptr<CommHook> hook) {
  state_->reducer->register_comm_hook(std::move(hook));
}

void DistributedDataParallelBase::register_comm_hook(CommHookFn hook) {
  register_comm_hook(make_comm_hook(std::move(hook)));
}

NoSyncGuard DistributedDataParallelBase::no_sync() { return NoSyncGuard(*this); }

trace::Scope DistributedDataParallelBase::trace_scope(std::string name) const {
  return trace::Scope(*this, std::move(name));
}

std::shared_ptr<detail::TraceWriter> DistributedDataParallelBase::trace_writer() const {
  return state_->trace;
}

bool DistributedDataParallelBase::before_forward() {
  State& s = *state_;
  if (at::GradMode::is_enabled()) {
    detail::check_outside_checkpoint(
        "ddp::DistributedDataParallel",
        "Checkpoint inside the model instead: its blocks "
        "(ddp::apply_activation_checkpointing<Block>(model), or ddp::checkpoint in a block's "
        "forward), and wrap the whole model with DistributedDataParallel.");
  }
  if (s.trace) s.forward_start_ns = detail::steady_now_ns();
  const bool wants_outputs = s.reducer->before_forward();
  if (!at::GradMode::is_enabled()) return false;
  int buffer_src = 0;
  if (s.join && s.join_notifier) {
    // See Note [Join rounds]: announce this forward to the ranks out of inputs.
    const bool sync = s.reducer->join_forward_syncs();
    const JoinRound round = s.join->notify(sync);
    buffer_src = round.active_ranks.front();
    if (sync) {
      s.reducer->set_divisor(s.join->options().divide_by_initial_world_size()
                                 ? s.pg->size()
                                 : static_cast<int>(round.active_ranks.size()));
    }
  }
  s.reducer->rebuild_if_due();
  if (s.sync_buffers) detail::broadcast_coalesced(*s.pg, s.buffers, buffer_src);
  // Not inside join: the ranks out of inputs do not shadow this check.
  if (s.debug && !s.join && ++s.debug_forwards % s.debug_check_every == 0) {
    detail::verify_parameters_agree(*s.pg, s.named_parameters, s.debug_forwards);
  }
  return wants_outputs;
}

// ---- uneven inputs ------------------------------------------------------------------

void DistributedDataParallelBase::join(const std::function<void()>& body,
                                       const JoinOptions& options) {
  ddp::join({this}, body, options);
}

ProcessGroup& DistributedDataParallelBase::join_process_group() const { return *state_->pg; }

void DistributedDataParallelBase::join_enter(std::shared_ptr<detail::JoinContext> context,
                                             bool notifier) {
  State& s = *state_;
  DDP_CHECK(!s.join, "DistributedDataParallel on rank ", s.pg->rank(), " of ", s.pg->size(),
            ": this model is already inside a ddp::join; joins do not nest.");
  // A second model's forwards are not announced, and its buckets interleave with the
  // first one's in backward in an order a joined rank cannot reproduce.
  DDP_CHECK(notifier, "DistributedDataParallel on rank ", s.pg->rank(), " of ", s.pg->size(),
            ": a DistributedDataParallel model must be the first participant of ddp::join, "
            "and a join takes one such model. Wrap the models in one module and one "
            "DistributedDataParallel.");
  s.join = std::move(context);
  s.join_notifier = notifier;
  s.shadowing = false;
}

void DistributedDataParallelBase::join_leave() noexcept {
  State& s = *state_;
  s.join.reset();
  s.join_notifier = false;
  s.shadowing = false;
  s.reducer->set_divisor(s.pg->size());
}

// One training iteration of the others, as they issue it in before_forward and
// backward: rebuild, buffers, then the reduction if their forward is reduced.
void DistributedDataParallelBase::join_shadow(const JoinRound& round) {
  State& s = *state_;
  if (!s.shadowing) {
    s.reducer->begin_shadowing();
    s.shadowing = true;
  }
  s.reducer->rebuild_if_due();
  if (s.sync_buffers) detail::broadcast_coalesced(*s.pg, s.buffers, round.active_ranks.front());
  if (round.sync) s.reducer->shadow_reduction();
}

// Ranks that shadowed took no optimizer steps: every rank takes the parameters and
// buffers of one that trained to the end.
void DistributedDataParallelBase::join_finish(int src) {
  detail::broadcast_coalesced(*state_->pg, state_->state_tensors, src);
}

void DistributedDataParallelBase::after_forward(const std::vector<at::Tensor>& outputs,
                                                const char* output_type) {
  State& s = *state_;
  if (s.trace) {
    const int64_t now = detail::steady_now_ns();
    s.trace->complete("forward", detail::kMainTrack, detail::trace_us(s.forward_start_ns),
                      (now - s.forward_start_ns) / 1000);
  }
  s.reducer->after_forward(outputs, output_type);
}

NoSyncGuard::NoSyncGuard(DistributedDataParallelBase& model) : model_(&model) {
  model_->state_->reducer->enter_no_sync();
}

NoSyncGuard::~NoSyncGuard() { model_->state_->reducer->exit_no_sync(); }

}  // namespace ddp
