// Pipeline stages and schedules (include/ddp/parallel/pipelining.h).
//
// Note [Pipeline messages]
// Stage s sends its microbatches' outputs to stage s + 1 and receives their gradients
// back, in the schedule's order: forwards in microbatch order, backwards in microbatch
// order, on every stage, so one tag per direction is enough (a pair's messages with one
// tag arrive in the order sent). Each message is a header, then the tensor: the header
// is kHeader int64s, {status, dtype, ndim, sizes...}, so a receiver needs to know nothing
// in advance (the last microbatch may be smaller). Sends are isends, waited for at the
// end of the step (Gloo's send completes only once the peer has posted its receive);
// receives block, with the group's timeout.
//
// Note [Pipelines and data parallelism]
// DDP and fully_shard run one backward per forward (their hooks and the reducer's state
// follow a forward/backward pair), while a schedule runs several microbatches' forwards
// before their backwards. So a stage is given as the plain module, and
// PipelineStage::replicate_over(dp) averages its gradients across the data-parallel
// replicas of the stage (the same stage of the other pipelines) once the step's
// backwards are done: DDP's result, without its overlap with the backward.
//
// Note [A stage that fails]
// A stage whose forward, backward or loss throws sends a header with status "failed" and
// its stage index to both neighbours, in place of the next message each expects, and
// throws. A stage that receives such a header passes it on, away from where it came
// from, and throws too; so every stage ends the step with an error naming the stage that
// failed, and no stage waits for a message that will never come. A stage that dies
// outright breaks its connections: its neighbours' receives fail (or time out with the
// group's timeout), and they pass the failure on the same way.

#include <ddp/parallel/pipelining.h>

#include <ddp/distributed/default_group.h>
#include <ddp/errors.h>
#include <ddp/fsdp/fully_shard.h>
#include <ddp/parallel/distributed_data_parallel.h>

#include "distributed/common/check.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

namespace ddp {
namespace {

constexpr int kForwardTag = 7100;   // activations, stage s -> s + 1
constexpr int kBackwardTag = 7101;  // gradients, stage s + 1 -> s
constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeader = 3 + kMaxDims;
constexpr int64_t kOk = 0;
constexpr int64_t kFailed = 1;

// Thrown inside the step when a neighbour reported a failure (passed on, not re-sent back).
struct PeerFailed {
  int64_t stage;
  bool from_upstream;
};

at::Tensor header_of(const at::Tensor& t) {
  DDP_CHECK(t.dim() <= kMaxDims, "pipeline: a stage's output has ", t.dim(),
            " dimensions; at most ", kMaxDims, " are sent between stages.");
  at::Tensor h = at::zeros({kHeader}, at::kLong);
  auto* p = h.data_ptr<int64_t>();
  p[0] = kOk;
  p[1] = static_cast<int64_t>(t.scalar_type());
  p[2] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) p[3 + d] = t.size(d);
  return h;
}

at::Tensor failure_header(int64_t stage) {
  at::Tensor h = at::zeros({kHeader}, at::kLong);
  h.data_ptr<int64_t>()[0] = kFailed;
  h.data_ptr<int64_t>()[1] = stage;
  return h;
}

}  // namespace

namespace detail {

// One step's state on one stage.
struct PipelineRun {
  PipelineStage& stage;
  ProcessGroup& group;
  int rank;
  std::vector<Work> sends;
  std::vector<int> send_to;      // each send's receiver
  std::vector<at::Tensor> keep;  // what pending sends read from
  std::vector<at::Tensor> inputs, targets;
  std::vector<at::Tensor> stage_inputs, stage_outputs, losses, outputs;

  PipelineRun(PipelineStage& s) : stage(s), group(*s.group()), rank(s.stage_index()) {}

  void send(const at::Tensor& t, int to, int tag) {
    at::Tensor h = header_of(t);
    at::Tensor data = t.detach().contiguous();
    sends.push_back(group.isend(h, to, tag));
    sends.push_back(group.isend(data, to, tag));
    send_to.push_back(to);
    send_to.push_back(to);
    keep.push_back(h);
    keep.push_back(data);
  }

  at::Tensor receive(int from, int tag, bool upstream, const char* what, int microbatch) {
    at::Tensor h = at::empty({kHeader}, at::kLong);
    try {
      group.recv(h, from, tag);
    } catch (const std::exception& e) {
      throw PeerFailed{from, upstream};  // a dead neighbour: passed on like a failure
    }
    const auto* p = h.data_ptr<int64_t>();
    if (p[0] == kFailed) throw PeerFailed{p[1], upstream};
    DDP_CHECK(p[0] == kOk && p[2] >= 0 && p[2] <= kMaxDims, "pipeline stage ", rank,
              ": a damaged header from stage ", from, " (", what, " of microbatch ", microbatch,
              ").");
    std::vector<int64_t> sizes(p + 3, p + 3 + p[2]);
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(static_cast<at::ScalarType>(p[1])));
    try {
      group.recv(t, from, tag);
    } catch (const std::exception&) {
      throw PeerFailed{from, upstream};  // it died between the header and the tensor
    }
    return t;
  }

  void wait_sends() {
    for (size_t i = 0; i < sends.size(); ++i) {
      try {
        sends[i].wait();
      } catch (const std::exception&) {  // the receiver is gone
        throw PeerFailed{send_to[i], send_to[i] < rank};
      }
    }
    send_to.clear();
    sends.clear();
    keep.clear();
  }

  // Tells the neighbours that stage `failed` failed, except the one it came from, and
  // waits until they have the message (Gloo sends when the receiver asks; a process that
  // exits at once would take an unsent message with it). Each neighbour is waiting for,
  // or will next wait for, a message in that direction; one that is gone fails the wait,
  // and the group's timeout bounds it.
  void pass_on(int64_t failed, bool skip_upstream, bool skip_downstream) {
    const at::Tensor h = failure_header(failed);
    std::vector<Work> notes;
    auto note = [&](int to, int tag) {
      try {
        notes.push_back(group.isend(h, to, tag));
      } catch (...) {
      }
    };
    if (!stage.is_last() && !skip_downstream) note(rank + 1, kForwardTag);
    if (!stage.is_first() && !skip_upstream) note(rank - 1, kBackwardTag);
    for (Work& w : notes) {
      try {
        w.wait();
      } catch (...) {
      }
    }
  }
};

}  // namespace detail

torch::nn::Sequential pipeline_slice(const torch::nn::Sequential& model, int stage_index,
                                     int num_stages, std::vector<int> split_points) {
  const int n = static_cast<int>(model->size());
  DDP_CHECK(num_stages >= 1 && stage_index >= 0 && stage_index < num_stages,
            "ddp::pipeline_slice: stage ", stage_index, " of ", num_stages,
            " stages; expected 0 <= stage_index < num_stages.");
  std::vector<int> begins;
  if (split_points.empty()) {
    DDP_CHECK(n >= num_stages, "ddp::pipeline_slice: ", n, " layers cannot make ", num_stages,
              " stages of at least one layer each.");
    int at = 0;
    for (int s = 0; s < num_stages; ++s) {
      begins.push_back(at);
      at += n / num_stages + (s < n % num_stages ? 1 : 0);
    }
  } else {
    DDP_CHECK(static_cast<int>(split_points.size()) == num_stages - 1,
              "ddp::pipeline_slice: ", split_points.size(), " split points for ", num_stages,
              " stages; expected ", num_stages - 1, " (each stage's first layer after stage 0).");
    begins.push_back(0);
    for (int p : split_points) {
      DDP_CHECK(p > begins.back() && p < n, "ddp::pipeline_slice: split points ",
                c10::IntArrayRef(std::vector<int64_t>(split_points.begin(), split_points.end())),
                " must rise strictly within (0, ", n, "), so that every stage has a layer.");
      begins.push_back(p);
    }
  }
  const int begin = begins[static_cast<size_t>(stage_index)];
  const int end = stage_index + 1 < num_stages ? begins[static_cast<size_t>(stage_index) + 1] : n;
  torch::nn::Sequential out;
  for (int i = begin; i < end; ++i) out->push_back(std::to_string(i), *(model->begin() + i));
  return out;
}

PipelineStage::PipelineStage(std::shared_ptr<torch::nn::Module> module,
                             std::function<at::Tensor(const at::Tensor&)> forward, int stage_index,
                             int num_stages, std::shared_ptr<ProcessGroup> group)
    : module_(std::move(module)),
      forward_(std::move(forward)),
      stage_index_(stage_index),
      num_stages_(num_stages),
      group_(group ? std::move(group) : (is_initialized() ? default_group() : nullptr)) {
  DDP_CHECK(module_ != nullptr && forward_, "ddp::PipelineStage: the module is null.");
  DDP_CHECK(group_ != nullptr, "ddp::PipelineStage: no group; call ddp::init_process_group "
                               "first or pass the pipeline's group.");
  DDP_CHECK(num_stages_ == group_->size(), "ddp::PipelineStage: ", num_stages_,
            " stages on a group of ", group_->size(),
            " ranks; each rank runs one stage, so they must be equal.");
  DDP_CHECK(stage_index_ == group_->rank(), "ddp::PipelineStage: stage ", stage_index_, " on rank ",
            group_->rank(), " of the pipeline group; stage i runs on the group's rank i.");
  // Note [Pipelines and data parallelism]
  DDP_CHECK(dynamic_cast<FullyShardBase*>(module_.get()) == nullptr &&
                dynamic_cast<DistributedDataParallelBase*>(module_.get()) == nullptr,
            "ddp::PipelineStage: the stage's module is under ",
            dynamic_cast<FullyShardBase*>(module_.get()) ? "ddp::fully_shard" : "DDP",
            ", which runs one backward per forward, but a pipeline schedule runs several "
            "microbatches' forwards before their backwards. Give the plain module, and "
            "replicate_over(the data-parallel group) to average its gradients across the "
            "pipelines at the end of each step.");
}

PipelineStage& PipelineStage::replicate_over(std::shared_ptr<ProcessGroup> group) {
  data_parallel_ = std::move(group);
  return *this;
}

PipelineSchedule::PipelineSchedule(PipelineStage& stage, int n_microbatches, PipelineLossFn loss_fn,
                                   bool scale_grads)
    : stage_(stage),
      n_microbatches_(n_microbatches),
      loss_fn_(std::move(loss_fn)),
      scale_grads_(scale_grads) {
  DDP_CHECK(n_microbatches_ >= 1, "ddp::PipelineSchedule: n_microbatches must be >= 1, got ",
            n_microbatches_, ".");
}

std::vector<std::pair<bool, int>> ScheduleGPipe::order() const {
  std::vector<std::pair<bool, int>> out;
  for (int i = 0; i < n_microbatches_; ++i) out.emplace_back(true, i);
  if (loss_fn_) {
    for (int i = 0; i < n_microbatches_; ++i) out.emplace_back(false, i);
  }
  return out;
}

std::vector<std::pair<bool, int>> Schedule1F1B::order() const {
  std::vector<std::pair<bool, int>> out;
  if (!loss_fn_) {
    for (int i = 0; i < n_microbatches_; ++i) out.emplace_back(true, i);
    return out;
  }
  const int warmup = std::min(n_microbatches_, stage_.num_stages() - stage_.stage_index() - 1);
  int f = 0, b = 0;
  for (; f < warmup; ++f) out.emplace_back(true, f);
  while (f < n_microbatches_) {
    out.emplace_back(true, f++);
    out.emplace_back(false, b++);
  }
  while (b < n_microbatches_) out.emplace_back(false, b++);
  return out;
}

at::Tensor PipelineSchedule::step(const at::Tensor& input, const at::Tensor& target,
                                  std::vector<at::Tensor>* losses) {
  detail::PipelineRun run(stage_);
  const int n = n_microbatches_;
  const int s = stage_.stage_index();
  const std::string who = "pipeline stage " + std::to_string(s);
  if (stage_.is_first()) {
    DDP_CHECK(input.defined(), who, ": the first stage takes the batch; pass it to step().");
    DDP_CHECK(input.dim() >= 1 && input.size(0) >= n, who, ": a batch of ",
              input.dim() ? input.size(0) : 0, " cannot make ", n,
              " microbatches; give at least one sample per microbatch.");
    run.inputs = at::tensor_split(input, n, 0);
  }
  const bool backward = static_cast<bool>(loss_fn_);
  if (stage_.is_last() && backward) {
    DDP_CHECK(target.defined(), who,
              ": the last stage computes the loss; pass the target to step().");
    DDP_CHECK(target.dim() >= 1 && target.size(0) >= n, who, ": a target of ",
              target.dim() ? target.size(0) : 0, " rows cannot make ", n, " microbatches.");
    run.targets = at::tensor_split(target, n, 0);
  }
  run.stage_inputs.resize(static_cast<size_t>(n));
  run.stage_outputs.resize(static_cast<size_t>(n));
  run.losses.resize(static_cast<size_t>(n));
  run.outputs.resize(static_cast<size_t>(n));

  auto forward = [&](int i) {
    at::Tensor x = stage_.is_first() ? run.inputs[static_cast<size_t>(i)]
                                     : run.receive(s - 1, kForwardTag, true, "the input", i);
    if (!stage_.is_first() && backward && at::isFloatingType(x.scalar_type())) {
      x.requires_grad_(true);
    }
    at::Tensor y = stage_.forward(x);
    run.stage_inputs[static_cast<size_t>(i)] = x;
    if (stage_.is_last()) {
      run.outputs[static_cast<size_t>(i)] = y;
      if (backward)
        run.losses[static_cast<size_t>(i)] = loss_fn_(y, run.targets[static_cast<size_t>(i)]);
    } else {
      run.send(y, s + 1, kForwardTag);
      run.stage_outputs[static_cast<size_t>(i)] = y;
    }
  };
  auto backward_one = [&](int i) {
    const size_t k = static_cast<size_t>(i);
    if (stage_.is_last()) {
      run.losses[k].backward();
    } else {
      const at::Tensor g = run.receive(s + 1, kBackwardTag, false, "the gradient", i);
      run.stage_outputs[k].backward(g);
      run.stage_outputs[k] = at::Tensor();
    }
    if (!stage_.is_first()) {
      const at::Tensor& x = run.stage_inputs[k];
      run.send(x.grad().defined() ? x.grad() : at::zeros_like(x), s - 1, kBackwardTag);
    }
    run.stage_inputs[k] = at::Tensor();  // its activations go now
  };

  try {
    for (const auto& [is_forward, i] : order()) {
      if (is_forward) {
        forward(i);
      } else {
        backward_one(i);
      }
    }
    run.wait_sends();
  } catch (const PeerFailed& failed) {
    run.pass_on(failed.stage, /*skip_upstream=*/failed.from_upstream,
                /*skip_downstream=*/!failed.from_upstream);
    throw ProcessGroupError(c10::str(who, ": stage ", failed.stage,
                                     " failed or is gone, so this step stopped here; see that "
                                     "stage's error (its rank's output)."));
  } catch (const std::exception& e) {
    run.pass_on(s, false, false);
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    throw ProcessGroupError(c10::str(who, " failed, and told the other stages: ",
                                     c10_error ? c10_error->msg() : std::string(e.what())));
  }
  if (backward && ((scale_grads_ && n > 1) || stage_.data_parallel())) {
    at::NoGradGuard no_grad;
    const auto& dp = stage_.data_parallel();
    const double divide = (scale_grads_ ? n : 1) * (dp ? dp->size() : 1);
    for (auto& p : stage_.module()->parameters()) {
      if (!p.requires_grad()) continue;
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      if (dp) dp->all_reduce(p.mutable_grad(), ReduceOp::SUM);  // in parameter order
      p.mutable_grad().div_(divide);
    }
  }
  if (losses != nullptr) {
    losses->clear();
    if (stage_.is_last() && backward) {
      for (const at::Tensor& l : run.losses) losses->push_back(l.detach());
    }
  }
  if (!stage_.is_last()) return at::Tensor();
  std::vector<at::Tensor> outs;
  for (const at::Tensor& o : run.outputs) outs.push_back(o.detach());
  return at::cat(outs, 0);
}

}  // namespace ddp
