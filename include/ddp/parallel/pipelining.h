#pragma once

// Pipeline parallelism: PyTorch's torch.distributed.pipelining for LibTorch modules. A
// model is cut into stages, one per rank of the pipeline group; a schedule splits the
// batch into microbatches and runs them through the stages, sending activations forward
// and their gradients back with point-to-point messages. Design and the table against
// PyTorch's API: docs/pipeline.md.
//
// Example (4 ranks, each runs this):
//   auto model = torch::nn::Sequential(...);                  // the whole model, built alike
//   ddp::PipelineStage stage(ddp::pipeline_slice(model, rank, 4), rank, 4);
//   ddp::Schedule1F1B schedule(stage, /*n_microbatches=*/8,
//       [](const at::Tensor& out, const at::Tensor& y) { return at::mse_loss(out, y); });
//   torch::optim::SGD opt(stage.module()->parameters(), 0.1);
//   for (...) {
//     std::vector<at::Tensor> losses;
//     if (rank == 0) schedule.step(x);                        // the first stage: the input
//     else if (rank == 3) schedule.step({}, y, &losses);      // the last: the target
//     else schedule.step();
//     opt.step(); opt.zero_grad();
//   }

#include <ddp/distributed/process_group.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

/// The layers of `model` that stage `stage_index` of `num_stages` runs: the children
/// [begin, end) of the Sequential, split as evenly as their count allows (the first
/// stages take one more when it does not divide), or at `split_points` (the index of each
/// stage's first child after stage 0, ascending). The layers are the model's own modules,
/// not copies.
torch::nn::Sequential pipeline_slice(const torch::nn::Sequential& model, int stage_index,
                                     int num_stages, std::vector<int> split_points = {});

/// torch.distributed.pipelining.PipelineStage: this rank's part of the model (a module
/// with one tensor in and one tensor out), which is stage `stage_index` of `num_stages`,
/// on rank `stage_index` of `group` (nullptr: the default group). Stage 0 takes the
/// schedule's input; the last stage's output goes to the loss.
class PipelineStage {
 public:
  /// `forward` runs `module` (one tensor in, one out).
  PipelineStage(std::shared_ptr<torch::nn::Module> module,
                std::function<at::Tensor(const at::Tensor&)> forward, int stage_index,
                int num_stages, std::shared_ptr<ProcessGroup> group = nullptr);
  /// Any module whose forward takes a tensor and returns one (a Sequential too).
  template <typename M>
  PipelineStage(std::shared_ptr<M> module, int stage_index, int num_stages,
                std::shared_ptr<ProcessGroup> group = nullptr)
      : PipelineStage(
            module, [module](const at::Tensor& x) -> at::Tensor { return module->forward(x); },
            stage_index, num_stages, std::move(group)) {}
  template <typename M>
  PipelineStage(const torch::nn::ModuleHolder<M>& module, int stage_index, int num_stages,
                std::shared_ptr<ProcessGroup> group = nullptr)
      : PipelineStage(module.ptr(), stage_index, num_stages, std::move(group)) {}

  int stage_index() const { return stage_index_; }
  int num_stages() const { return num_stages_; }
  bool is_first() const { return stage_index_ == 0; }
  bool is_last() const { return stage_index_ == num_stages_ - 1; }
  /// The stage's module (its parameters are what an optimizer of this rank steps).
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  at::Tensor forward(const at::Tensor& x) const { return forward_(x); }
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }
  /// Data parallelism across pipelines: after each step's backwards, the stage's
  /// gradients are averaged over `group` (the ranks that run this stage in the other
  /// pipelines, e.g. mesh["dp"]), as DDP would average them. DDP and fully_shard cannot
  /// wrap a stage's module (Note [Pipelines and data parallelism] in
  /// src/pipelining/pipeline.cpp).
  PipelineStage& replicate_over(std::shared_ptr<ProcessGroup> group);
  const std::shared_ptr<ProcessGroup>& data_parallel() const { return data_parallel_; }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::function<at::Tensor(const at::Tensor&)> forward_;
  int stage_index_;
  int num_stages_;
  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<ProcessGroup> data_parallel_;
};

/// The loss of one microbatch: the last stage's output and that microbatch's target.
using PipelineLossFn =
    std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

/// What the schedules share: torch.distributed.pipelining's PipelineScheduleSingle.
class PipelineSchedule {
 public:
  virtual ~PipelineSchedule() = default;

  /// One step over a batch. Stage 0 gives `input` (split along dim 0 into the
  /// microbatches, as torch.tensor_split: sizes differ by at most one, the first ones
  /// larger); the last stage gives `target` (split alike) when there is a loss function,
  /// and gets each microbatch's loss in `losses` (detached) if not null; the others give
  /// nothing. With a loss function every stage runs backward: each microbatch's loss
  /// gradient is accumulated into the parameters' .grad(), divided by the number of
  /// microbatches (scale_grads, as PyTorch's default), so a step equals one
  /// process's gradient accumulation over the microbatches. Returns, on the last stage,
  /// the outputs of all microbatches joined along dim 0; an undefined tensor elsewhere.
  /// Collective over the pipeline group. A stage that throws stops the pipeline: every
  /// stage throws ddp::ProcessGroupError naming the stage that failed, and nothing waits.
  at::Tensor step(const at::Tensor& input = at::Tensor(), const at::Tensor& target = at::Tensor(),
                  std::vector<at::Tensor>* losses = nullptr);

  int n_microbatches() const { return n_microbatches_; }

 protected:
  PipelineSchedule(PipelineStage& stage, int n_microbatches, PipelineLossFn loss_fn,
                   bool scale_grads);
  /// The order of this stage's work: (forward, microbatch) pairs.
  virtual std::vector<std::pair<bool, int>> order() const = 0;

  PipelineStage& stage_;
  int n_microbatches_;
  PipelineLossFn loss_fn_;
  bool scale_grads_;
};

/// torch.distributed.pipelining.ScheduleGPipe: every microbatch's forward, then every
/// backward. Keeps all microbatches' activations until the backward.
class ScheduleGPipe : public PipelineSchedule {
 public:
  ScheduleGPipe(PipelineStage& stage, int n_microbatches, PipelineLossFn loss_fn = nullptr,
                bool scale_grads = true)
      : PipelineSchedule(stage, n_microbatches, std::move(loss_fn), scale_grads) {}

 protected:
  std::vector<std::pair<bool, int>> order() const override;
};

/// torch.distributed.pipelining.Schedule1F1B: stage s runs num_stages - s - 1 forwards,
/// then alternates one forward and one backward, then the remaining backwards. The same
/// gradients as GPipe, with at most num_stages - s microbatches' activations alive.
class Schedule1F1B : public PipelineSchedule {
 public:
  Schedule1F1B(PipelineStage& stage, int n_microbatches, PipelineLossFn loss_fn = nullptr,
               bool scale_grads = true)
      : PipelineSchedule(stage, n_microbatches, std::move(loss_fn), scale_grads) {}

 protected:
  std::vector<std::pair<bool, int>> order() const override;
};

}  // namespace ddp
