// A character-level GPT trained on every core or GPU you have: PyTorch's minGPT-DDP
// tutorial (pytorch/examples, distributed/minGPT-ddp) in C++.
//
//   build/bin/ddprun --nproc-per-node 2 -- build/bin/gpt
//
// The model (examples/gpt/model.h) is a decoder-only transformer with tied input and
// output embeddings; the data (examples/gpt/text.h) any UTF-8 text file, by default
// Debian's fortunes songs and poems. Flags are named after the tutorial's config
// (gpt2_train_cfg.yaml): --n-layer, --n-head, --n-embd, --block-size, --batch-size,
// --max-epochs, --learning-rate, --weight-decay, --grad-norm-clip, --save-every,
// --truncate, --train-split; docs/gpt.md sets them side by side.
//
// The ten steps of the DDP lesson are those of examples/fashion_mnist.cpp; what this
// program adds is what a transformer run needs: AdamW with weight decay on matrices only,
// gradient clipping, gradient accumulation (--grad-accum, through no_sync), mixed
// precision (--amp), ZeRO (--zero) or full sharding (--fsdp), activation checkpointing
// (--activation-checkpointing), checkpoints every N steps
// that resume bit-identically in the middle of an epoch, validation loss, tokens/s,
// metrics.jsonl and loss.svg, and a sample generated at the end.
//
// examples/gpt/gpt.py is the same model and loop in Python, for torchrun; given this
// program's initial weights (--save-init) it computes the same losses.

#include <ddp/ddp.h>

#include <CLI/CLI.hpp>

#include "common/cli_checks.h"
#include <torch/torch.h>

#include "fashion_mnist/allocator.h"
#include "fashion_mnist/progress.h"
#include "gpt/model.h"
#include "gpt/report.h"
#include "gpt/text.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Sums over ranks: the collective takes tensors on this rank's device (NCCL reads
// nothing else), so the host's numbers go there and the sums come back.
std::vector<double> sum_over_ranks(const std::vector<double>& values, const torch::Device& device) {
  auto t = torch::tensor(values, torch::kDouble).to(device);
  ddp::all_reduce(t, ddp::ReduceOp::SUM);
  t = t.cpu();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

// gpt --pp: clip the gradients by the norm of the whole model's, every stage's counted
// once (the last stage's copy of wte not again).
void clip_pipeline_grads(gpt::GptStageImpl& stage, double max_norm, ddp::ProcessGroup& pp) {
  std::vector<at::Tensor> grads;
  double squares = 0;
  for (const auto& item : stage.named_parameters()) {
    const at::Tensor& g = item.value().grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    const bool copy = stage.last && !stage.first && item.key() == "wte.weight";
    if (!copy) squares += g.to(torch::kDouble).pow(2).sum().item<double>();
  }
  auto total = torch::tensor({squares}, torch::kDouble);
  pp.all_reduce(total, ddp::ReduceOp::SUM);
  const double coef = max_norm / (std::sqrt(total.item<double>()) + 1e-6);
  if (coef < 1) {
    torch::NoGradGuard no_grad;
    for (auto& g : grads) g.mul_(coef);
  }
}

// gpt --pp: the whole model's state dict on rank 0, from the first pipeline's stages
// (each writes its part, rank 0 reads them back in).
c10::Dict<std::string, at::Tensor> gather_stages(gpt::GptStageImpl& stage, int stage_index,
                                                 int dp_rank, const fs::path& out_dir) {
  const fs::path part = out_dir / (".stage-" + std::to_string(stage_index) + ".pt");
  if (dp_rank == 0) ddp::save_model_state_dict(stage, part.string());
  ddp::barrier();
  c10::Dict<std::string, at::Tensor> state;
  if (ddp::get_rank() == 0) {
    for (int s = 0;; ++s) {
      const fs::path p = out_dir / (".stage-" + std::to_string(s) + ".pt");
      if (!fs::exists(p)) break;
      for (const auto& kv : ddp::read_state_dict(p.string())) state.insert(kv.key(), kv.value());
    }
  }
  ddp::barrier();
  if (dp_rank == 0) fs::remove(part);
  return state;
}

}  // namespace

int main(int argc, char** argv) {
  fashion_mnist::keep_freed_memory();  // Note [Page faults in the first epoch]

  // ---- Options (the tutorial's config names) -------------------------------------------
  CLI::App app{"Train a character-level GPT with DistributedDataParallel (minGPT-DDP).\n"
               "Run it with a launcher, one process per device:\n"
               "  ddprun --nproc-per-node 2 -- gpt"};
  std::string data = gpt::kDefaultCorpus;
  double truncate = 1.0, train_split = 0.9;
  gpt::GptConfig config;
  int64_t max_epochs = 20, max_steps = 0, batch_size = 32, grad_accum = 1, save_every = 100,
          log_every = 10, seed = 42, sample_length = 300;
  double learning_rate = 1e-3, weight_decay = 0.1, grad_norm_clip = 1.0;
  int threads = 0, timeout_s = 1800, tp = 1, pp = 1, microbatches = 0;
  std::string schedule_name = "1f1b";
  std::string backend, run_dir = "runs", name = "gpt", prompt, save_init, checkpoint_format;
  bool resume = false, amp = false, zero = false, fsdp = false, activation_checkpointing = false,
       no_save = false;

  app.add_option("--data", data, "A UTF-8 text file; its characters are the vocabulary")
      ->capture_default_str();
  app.add_option("--truncate", truncate, "Use only this fraction of the text, from its start")
      ->capture_default_str();
  app.add_option("--train-split", train_split,
                 "Fraction of the text for training; the rest, after it, validates")
      ->capture_default_str();
  app.add_option("--block-size", config.block_size, "Context length in characters")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--n-layer", config.n_layer, "Transformer blocks")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--n-head", config.n_head, "Attention heads per block")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--n-embd", config.n_embd, "Embedding width (a multiple of --n-head)")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--dropout", config.dropout,
                 "Dropout probability (embeddings, attention, residuals)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  app.add_option("--max-epochs", max_epochs, "Epochs to train (in all, also with --resume)")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--max-steps", max_steps, "Stop after this many optimizer steps; 0: no limit")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_option("--batch-size", batch_size, "Windows per micro-batch on each rank")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--grad-accum", grad_accum,
                 "Micro-batches per optimizer step; all but the last skip the all-reduce "
                 "(no_sync)")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--learning-rate", learning_rate, "AdamW learning rate (betas 0.9, 0.95)")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--weight-decay", weight_decay, "AdamW weight decay, on Linear weights only")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_option("--grad-norm-clip", grad_norm_clip, "Clip the gradients' global norm; 0: off")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_option("--save-every", save_every,
                 "Checkpoint every N optimizer steps (and at each epoch's end); 0: epochs only")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_flag("--no-save", no_save,
               "Write no checkpoint, no model.pt and no sample: training alone (memory and "
               "speed measurements, bench/run-fsdp-cap)");
  app.add_option("--log-every", log_every, "A progress line and a metrics record every N steps")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--seed", seed, "Seed of the initial weights, the shuffle and the sample")
      ->capture_default_str();
  app.add_option("--prompt", prompt,
                 "The start of the generated sample; empty: the text's first character")
      ->capture_default_str();
  app.add_option("--sample-length", sample_length, "Characters to generate at the end; 0: none")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_option("--threads", threads,
                 "Torch threads per rank; 0: torch's default (ddprun sets OMP_NUM_THREADS "
                 "to cores / processes)")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_option("--backend", backend, examples::kBackendHelp)
      ->check(CLI::IsMember({"", "gloo", "nccl", "shm"}));
  app.add_option("--timeout", timeout_s, "Seconds a rank waits for the others in a collective")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--run-dir", run_dir, "Parent folder of the run's folder")->capture_default_str();
  app.add_option("--name", name, "The run's folder: <run-dir>/<name>")->capture_default_str();
  app.add_option("--save-init", save_init,
                 "Write the initial weights to this file (torch.load reads it; gpt.py --init)");
  app.add_flag("--resume", resume, "Continue from the latest checkpoint in <run-dir>/<name>");
  app.add_option("--checkpoint-format", checkpoint_format, examples::kCheckpointFormatHelp)
      ->check(CLI::IsMember({"", "file", "dcp"}));
  app.add_flag("--amp", amp,
               "Mixed precision: bfloat16 autocast on a CPU, float16 with a gradient "
               "scaler on a GPU");
  auto* zero_flag =
      app.add_flag("--zero", zero, "Shard AdamW's state over the ranks (ZeroRedundancyOptimizer)");
  app.add_flag("--fsdp", fsdp,
               "Shard weights, gradients and AdamW state (ddp::fully_shard on each block "
               "and the root) instead of DDP")
      ->excludes(zero_flag);
  app.add_option("--tp", tp,
                 "Tensor parallelism over N ranks (ddp::parallelize_module: q, k, v and fc "
                 "column-wise, the projections row-wise); the other ranks replicate with DDP, "
                 "or shard with --fsdp (a (dp, tp) mesh). N divides the ranks and --n-head")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--pp", pp,
                 "Pipeline parallelism over N ranks: each rank runs 1/N of the blocks (the "
                 "first also the embeddings, the last the output layer); the other ranks "
                 "replicate the pipeline (a (dp, pp) mesh). N divides the ranks")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--microbatches", microbatches,
                 "With --pp: microbatches per step (0: as many as stages)")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_option("--schedule", schedule_name, "With --pp: the pipeline schedule")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpipe", "1f1b"}));
  app.add_flag("--activation-checkpointing", activation_checkpointing,
               "Keep no activations inside the blocks; backward recomputes them (each block "
               "in ddp::checkpoint_wrapper, inside its fully_shard unit with --fsdp). Same "
               "losses, less memory, about a third more compute");
  CLI11_PARSE(app, argc, argv);
  if (pp > 1 &&
      (tp > 1 || fsdp || zero || amp || activation_checkpointing || grad_accum > 1 || resume)) {
    std::fprintf(stderr,
                 "gpt: --pp %d goes with plain DDP-style replicas only for now; drop --tp, "
                 "--fsdp, --zero, --amp, --activation-checkpointing, --grad-accum and --resume "
                 "(--microbatches accumulates within a step).\n",
                 pp);
    return 2;
  }
  if (microbatches == 0) microbatches = pp;
  if (tp > 1 && (zero || activation_checkpointing)) {
    std::fprintf(stderr,
                 "gpt: --tp %d with %s is not supported yet. Use --tp with DDP or "
                 "--fsdp.\n",
                 tp, zero ? "--zero" : "--activation-checkpointing");
    return 2;
  }
  if (tp > 1 && config.n_head % tp != 0) {
    std::fprintf(stderr, "gpt: --tp %d must divide --n-head (%lld): each rank takes whole heads.\n",
                 tp, static_cast<long long>(config.n_head));
    return 2;
  }
  if (no_save && resume) {
    std::fprintf(stderr, "gpt: --no-save and --resume exclude each other: --no-save writes no "
                         "checkpoint to resume from. Drop one of them.\n");
    return 2;
  }
  if (threads > 0) torch::set_num_threads(threads);
  const fs::path out_dir = fs::path(run_dir) / name;

  try {
    // Steps 1-4 of the lesson: launched by ddprun, rank from the environment, the group,
    // the device by local rank.
    const ddp::RankInfo me = ddp::rank_info_from_env();
    ddp::ProcessGroupGuard group(ddp::InitOptions()
                                     .backend(backend)
                                     .rank(me.rank)
                                     .world_size(me.world_size)
                                     .local_rank(me.local_rank)
                                     .timeout(std::chrono::seconds(timeout_s)));
    const int rank = ddp::get_rank();
    const int world_size = ddp::get_world_size();
    const torch::Device device = ddp::get_device();
    // --tp: a (dp, tp) mesh; the ranks of a "tp" row hold one replica between them and
    // see the same batches, the "dp" ranks different ones.
    if (world_size % (tp * pp) != 0) {
      if (rank == 0) {
        std::fprintf(stderr, "gpt: --%s %d must divide the number of ranks (%d).\n",
                     pp > 1 ? "pp" : "tp", pp > 1 ? pp : tp, world_size);
      }
      return 2;
    }
    std::optional<ddp::DeviceMesh> mesh;
    std::shared_ptr<ddp::ProcessGroup> dp_group;  // nullptr: every rank (no --tp)
    int dp_rank = rank, dp_size = world_size;
    if (tp > 1) {
      mesh = ddp::init_device_mesh(device.is_cuda() ? "cuda" : "cpu", {world_size / tp, tp},
                                   {"dp", "tp"});
      dp_group = mesh->get_group("dp");
      dp_rank = static_cast<int>(mesh->get_local_rank("dp"));
      dp_size = world_size / tp;
    }
    // --pp: a (dp, pp) mesh; each "pp" row is one pipeline, stage = its index there.
    int stage_index = 0;
    std::shared_ptr<ddp::ProcessGroup> tie_group;  // the first and last stage: wte's copies
    if (pp > 1) {
      mesh = ddp::init_device_mesh("cpu", {world_size / pp, pp}, {"dp", "pp"});
      dp_group = mesh->get_group("dp");
      dp_rank = static_cast<int>(mesh->get_local_rank("dp"));
      dp_size = world_size / pp;
      stage_index = static_cast<int>(mesh->get_local_rank("pp"));
      for (int row = 0; row < dp_size; ++row) {  // every rank makes every group, in order
        auto g = ddp::new_group({row * pp, row * pp + pp - 1});
        if (row == dp_rank) tie_group = g;
      }
    }

    // The data: every rank reads the file; the sampler decides who trains on what.
    const gpt::Corpus corpus = gpt::load_corpus(data, truncate, train_split, config.block_size);
    config.vocab_size = static_cast<int64_t>(corpus.vocabulary.size());
    const std::vector<int64_t> prompt_ids =  // checked now, not after the training
        prompt.empty() ? std::vector<int64_t>{corpus.train.tokens[0].item<int64_t>()}
                       : corpus.encode(prompt);
    fs::create_directories(out_dir);

    torch::manual_seed(seed);  // the same initial weights on every rank
    gpt::Gpt model(config);
    model->to(device);
    int64_t parameter_count = 0;
    for (const auto& p : model->parameters()) parameter_count += p.numel();

    // --tp: each rank its heads of q, k, v and proj, its columns of fc and rows of proj
    // (Note [Tensor-parallel GPT] in gpt/model.h).
    if (tp > 1) {
      ddp::parallelize_module(*model, (*mesh)["tp"],
                              {{"blocks.*.attn.q", ddp::ColwiseParallel()},
                               {"blocks.*.attn.k", ddp::ColwiseParallel()},
                               {"blocks.*.attn.v", ddp::ColwiseParallel()},
                               {"blocks.*.attn.proj", ddp::RowwiseParallel()},
                               {"blocks.*.mlp.fc", ddp::ColwiseParallel()},
                               {"blocks.*.mlp.proj", ddp::RowwiseParallel()}});
    }
    const bool split = fsdp || tp > 1;  // a parameter's whole value needs a gather

    // --pp: this rank's stage of the pipeline (gpt::GptStage), run by a schedule.
    gpt::GptStage stage_module{nullptr};
    std::unique_ptr<ddp::PipelineStage> pipeline_stage;
    std::unique_ptr<ddp::PipelineSchedule> schedule, eval_schedule;
    double batch_tokens = 1;  // the step's target tokens, for the loss's scale
    if (pp > 1) {
      stage_module = gpt::GptStage(*model, stage_index, pp);
      pipeline_stage = std::make_unique<ddp::PipelineStage>(stage_module, stage_index, pp,
                                                            mesh->get_group("pp"));
      if (dp_size > 1) pipeline_stage->replicate_over(dp_group);
      // Each microbatch's loss is its tokens' summed cross-entropy over the step's tokens,
      // times the microbatches (which the schedule divides by): the gradient of the
      // batch's mean, whatever the microbatches' sizes.
      auto loss = [&](const at::Tensor& logits, const at::Tensor& y) {
        return torch::nn::functional::cross_entropy(
                   logits.to(torch::kFloat).view({-1, config.vocab_size}), y.reshape({-1}),
                   torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) *
               (static_cast<double>(microbatches) / batch_tokens);
      };
      if (schedule_name == "gpipe") {
        schedule = std::make_unique<ddp::ScheduleGPipe>(*pipeline_stage, microbatches, loss);
      } else {
        schedule = std::make_unique<ddp::Schedule1F1B>(*pipeline_stage, microbatches, loss);
      }
      eval_schedule = std::make_unique<ddp::ScheduleGPipe>(*pipeline_stage, 1);
    }

    // Step 5: replicate with DDP (which broadcasts rank 0's weights), or shard: each block
    // a unit, then the root (each rank keeps its rows of every weight). With --tp, over
    // the "dp" ranks.
    ddp::DistributedDataParallel<gpt::Gpt> dmodel{nullptr};
    ddp::FullyShard<gpt::GptImpl> sharded{nullptr};
    // --activation-checkpointing first: each block's checkpoint sits inside its unit.
    if (activation_checkpointing) ddp::apply_activation_checkpointing<gpt::BlockImpl>(*model);
    if (fsdp) {
      const auto shard_options = ddp::FullyShardOptions().process_group(dp_group);
      for (size_t i = 0; i < model->blocks->size(); ++i) {
        if (activation_checkpointing) {
          ddp::fully_shard(model->blocks->ptr<ddp::CheckpointWrapperImpl<gpt::BlockImpl>>(i),
                           shard_options);
        } else {
          ddp::fully_shard(model->blocks->ptr<gpt::BlockImpl>(i), shard_options);
        }
      }
      sharded = ddp::fully_shard(model.ptr(), shard_options);
    } else if (pp == 1) {
      auto options = ddp::DistributedDataParallelOptions().process_group(dp_group);
      if (device.is_cuda()) options.device_ids({device.index()});
      dmodel = ddp::DistributedDataParallel(model, options);
    }
    auto forward = [&](const torch::Tensor& x) { return fsdp ? sharded(x) : dmodel(x); };
    // But each replica its own dropout masks (a tp row shares them: its activations
    // outside the split layers are the same tensors).
    torch::manual_seed(seed + dp_rank);

    if (!save_init.empty() && !resume) {
      const auto state = split ? ddp::full_state_dict(*model) : ddp::model_state_dict(*model);
      if (rank == 0) ddp::save_state_dict(state, save_init);
    }

    // AdamW over two groups, as minGPT: weight decay on the Linear layers' weights, none on
    // biases, LayerNorms and embeddings. (Sharded, the model's parameters are the shards.)
    std::vector<at::Tensor> decay, no_decay;
    const auto trained = pp > 1 ? stage_module->named_parameters() : model->named_parameters();
    for (const auto& item : trained)
      (gpt::GptImpl::decays(item.key(), item.value()) ? decay : no_decay).push_back(item.value());
    auto adamw = torch::optim::AdamWOptions(learning_rate).betas({0.9, 0.95});
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(adamw).weight_decay(weight_decay)));
    groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                      torch::optim::AdamWOptions(adamw).weight_decay(0.0)));
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    ddp::ZeroRedundancyOptimizer* zero_optimizer = nullptr;
    if (zero) {
      auto z = std::make_unique<ddp::ZeroRedundancyOptimizer>(groups, adamw);
      zero_optimizer = z.get();
      optimizer = std::move(z);
    } else {
      optimizer = std::make_unique<torch::optim::AdamW>(groups, adamw);
    }

    // --amp: bfloat16 autocast on a CPU (no scaler needed); float16 and the scaler on a GPU.
    const ddp::amp::AutocastOptions autocast = ddp::amp::AutocastOptions().enabled(amp).dtype(
        device.is_cuda() ? torch::kHalf : torch::kBFloat16);
    const bool scaling = amp && device.is_cuda();
    ddp::amp::GradScaler scaler(ddp::amp::GradScalerOptions().enabled(scaling).process_group(
        fsdp ? ddp::default_group() : nullptr));

    // Step 7: each rank its slice of the training windows, reshuffled every epoch (step 8).
    ddp::DistributedSampler sampler(
        static_cast<size_t>(corpus.train.size()),
        ddp::DistributedSamplerOptions().seed(seed).num_replicas(dp_size).rank(dp_rank));
    const int64_t micro_batches =
        (static_cast<int64_t>(sampler.num_samples()) + batch_size - 1) / batch_size;
    const int64_t steps_per_epoch = (micro_batches + grad_accum - 1) / grad_accum;

    // Checkpoints: model, AdamW (or its shards), epoch, step, sampler position, RNG.
    // With --fsdp, --zero or --tp, DCP folders: each rank writes its own shards.
    const ddp::CheckpointOptions checkpoints =
        ddp::CheckpointOptions((out_dir / "checkpoints").string())
            .format(examples::checkpoint_format(checkpoint_format, split || zero));
    ddp::Checkpoint checkpoint(*model);
    if (zero_optimizer)
      checkpoint.optimizer(zero_optimizer);
    else
      checkpoint.optimizer(optimizer.get());
    checkpoint.sampler(&sampler);
    if (scaling) checkpoint.grad_scaler(&scaler);
    const fs::path metrics_path = out_dir / "metrics.jsonl";
    std::vector<gpt::StepMetrics> history;
    int64_t start_epoch = 0, step = 0;
    if (rank == 0 && !resume) fs::remove_all(out_dir / "checkpoints");
    ddp::barrier();
    if (resume) {
      if (auto path = ddp::load_latest_checkpoint(checkpoints, checkpoint)) {
        start_epoch = checkpoint.epoch();
        step = checkpoint.step();
        for (const auto& m : gpt::read_metrics(metrics_path.string()))
          if (m.step <= step) history.push_back(m);
        if (rank == 0)
          std::printf("resuming from %s: step %lld, epoch %lld\n", path->c_str(),
                      static_cast<long long>(step), static_cast<long long>(start_epoch + 1));
      } else if (rank == 0) {
        std::printf("no checkpoint in %s; starting from step 0\n", checkpoints.directory().c_str());
      }
    }

    if (rank == 0) {
      std::printf(
          "gpt: %d rank(s), backend %s, device %s, %d thread(s) per rank, %s\n"
          "  model  %lld layers, %lld heads, n_embd %lld, block %lld: %.2fM parameters\n"
          "  data   %s: %lld characters, vocabulary %lld; %lld train / %lld validation windows\n"
          "  train  %lld epochs of %lld steps, %lld x %lld windows per rank per step "
          "(%lld tokens in all), AdamW lr %g%s\n",
          world_size, ddp::default_group()->backend().c_str(), device.str().c_str(),
          at::get_num_threads(),
          (std::string(fsdp   ? "fully_shard"
                       : zero ? "DDP + ZeRO"
                              : "DDP") +
           (tp > 1 ? " x tensor parallel " + std::to_string(tp) : std::string()) +
           (pp > 1 ? " x pipeline " + std::to_string(pp) + " (" + schedule_name + ", " +
                         std::to_string(microbatches) + " microbatches)"
                   : std::string()) +
           (activation_checkpointing ? ", activation checkpointing" : ""))
              .c_str(),
          static_cast<long long>(config.n_layer), static_cast<long long>(config.n_head),
          static_cast<long long>(config.n_embd), static_cast<long long>(config.block_size),
          parameter_count / 1e6, data.c_str(), static_cast<long long>(corpus.characters),
          static_cast<long long>(config.vocab_size), static_cast<long long>(corpus.train.size()),
          static_cast<long long>(corpus.validation.size()), static_cast<long long>(max_epochs),
          static_cast<long long>(steps_per_epoch), static_cast<long long>(grad_accum),
          static_cast<long long>(batch_size),
          static_cast<long long>(grad_accum * batch_size * dp_size * config.block_size),
          learning_rate,
          !amp               ? ""
          : device.is_cuda() ? ", mixed precision (float16, gradient scaler)"
                             : ", mixed precision (bfloat16)");
      std::fflush(stdout);
    }

    // Validation: the first windows of the validation text, an equal share per rank (a
    // sharded forward is collective: every rank runs the same batches). Mean loss per token.
    // (With --tp the ranks of a tp row run the same batches.)
    const int64_t eval_per_rank = std::min<int64_t>(corpus.validation.size(), 1024) / dp_size;
    auto validate = [&]() {
      double loss_sum = 0, tokens = 0;
      torch::NoGradGuard no_grad;
      model->eval();  // (a unit's own flag too: the root's forward checks it)
      if (fsdp) sharded->eval();
      for (int64_t i = 0; i < eval_per_rank; i += batch_size) {
        const int64_t begin = dp_rank * eval_per_rank + i;
        const int64_t end = dp_rank * eval_per_rank + std::min(eval_per_rank, i + batch_size);
        auto [x, y] = corpus.validation.range(begin, end);
        x = x.to(device), y = y.to(device);
        torch::Tensor logits;
        if (pp > 1) {  // the pipeline, forward only; the last stage has the logits
          stage_module->eval();
          logits = eval_schedule->step(pipeline_stage->is_first() ? x : at::Tensor());
          stage_module->train();
          if (!pipeline_stage->is_last()) continue;
        } else {
          ddp::amp::AutocastGuard guard(device.type(), autocast);
          logits = fsdp ? sharded(x) : model->forward(x);  // unwrapped: no gradient sync
        }
        loss_sum += torch::nn::functional::cross_entropy(
                        logits.to(torch::kFloat).view({-1, config.vocab_size}), y.view({-1}),
                        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                        .item<double>();
        tokens += static_cast<double>(y.numel());
      }
      model->train();
      if (fsdp) sharded->train();
      const auto sums = sum_over_ranks({loss_sum, tokens}, device);
      return sums[0] / sums[1];
    };

    // ---- Train ---------------------------------------------------------------------------
    const auto run_start = Clock::now();
    auto interval_start = Clock::now();
    double loss_sum = 0, loss_count = 0, tokens = 0;  // since the last record, this rank
    // A record: the interval's sums over all ranks, and validation when asked.
    auto record = [&](int64_t epoch, bool with_validation) {
      const auto sums = sum_over_ranks({loss_sum, loss_count, tokens}, device);
      gpt::StepMetrics m;
      m.step = step;
      m.epoch = epoch + 1;
      if (sums[1] > 0) m.train_loss = sums[0] / sums[1];
      m.tokens_per_s = sums[2] / seconds_since(interval_start);
      if (with_validation) m.val_loss = validate();
      m.seconds = seconds_since(run_start);
      m.world_size = world_size;
      loss_sum = loss_count = tokens = 0;
      if (!m.train_loss && !history.empty() && history.back().step == step) {
        history.back().val_loss = m.val_loss;  // validation after a step already recorded
        m = history.back();
      } else {
        history.push_back(m);
      }
      if (rank == 0) {
        gpt::write_metrics(metrics_path.string(), history);
        std::printf("step %6lld  epoch %lld/%lld", static_cast<long long>(step),
                    static_cast<long long>(m.epoch), static_cast<long long>(max_epochs));
        if (m.train_loss) std::printf("  loss %.4f", *m.train_loss);
        if (m.val_loss) std::printf("  val loss %.4f", *m.val_loss);
        if (m.train_loss) std::printf("  %8.0f tok/s", m.tokens_per_s);
        std::printf("  %s\n", fashion_mnist::format_duration(m.seconds).c_str());
        std::fflush(stdout);
      }
      interval_start = Clock::now();
    };
    auto save = [&](int64_t epoch) {
      // (--pp: a pipeline's checkpoints are not written yet; model.pt is, at the end.)
      if (!no_save && pp == 1) {
        ddp::save_checkpoint(checkpoints, checkpoint.epoch(epoch).step(step));
      }
    };

    model->train();
    bool stop = max_steps > 0 && step >= max_steps;
    for (int64_t epoch = start_epoch; epoch < max_epochs && !stop; ++epoch) {
      sampler.set_epoch(epoch);  // keeps a restored mid-epoch position
      bool epoch_done = false;
      while (!stop) {
        std::vector<std::vector<size_t>> micro;
        while (static_cast<int64_t>(micro.size()) < grad_accum) {
          auto indices = sampler.next(static_cast<size_t>(batch_size));
          if (!indices) break;
          micro.push_back(std::move(*indices));
        }
        if (micro.empty()) {
          epoch_done = true;
          break;
        }
        if (pp > 1) {  // one step of the pipeline over the step's windows
          auto [x, y] = corpus.train.batch(micro[0]);
          batch_tokens = static_cast<double>(y.numel());
          std::vector<at::Tensor> losses;
          schedule->step(pipeline_stage->is_first() ? x : at::Tensor(),
                         pipeline_stage->is_last() ? y : at::Tensor(), &losses);
          if (pipeline_stage->is_last()) {
            for (const at::Tensor& l : losses) loss_sum += l.item<double>() / microbatches;
            loss_count += 1;
          }
          tokens += static_cast<double>(y.numel()) / pp;
          // wte's two copies (the embedding's and the output layer's): one gradient, the
          // sum of both uses, as the tied weight of one process has.
          if (pipeline_stage->is_first() || pipeline_stage->is_last()) {
            ddp::all_reduce(stage_module->wte->weight.mutable_grad(), ddp::ReduceOp::SUM,
                            tie_group);
          }
          micro.clear();
        }
        for (size_t k = 0; k < micro.size(); ++k) {
          // Step 6: the last micro-batch's backward averages the accumulated gradients
          // over the ranks; the others skip the all-reduce.
          const bool sync = k + 1 == micro.size();
          auto [x, y] = corpus.train.batch(micro[k]);
          x = x.to(device), y = y.to(device);
          auto micro_step = [&] {
            torch::Tensor logits;
            {
              ddp::amp::AutocastGuard guard(device.type(), autocast);
              logits = forward(x);
            }
            const auto loss = torch::nn::functional::cross_entropy(
                logits.to(torch::kFloat).view({-1, config.vocab_size}), y.view({-1}));
            scaler.scale(loss / static_cast<double>(grad_accum)).backward();
            loss_sum += loss.item<double>();
          };
          if (fsdp) {
            sharded->set_requires_gradient_sync(sync);
            micro_step();
          } else if (!sync) {
            auto no_sync = dmodel->no_sync();
            micro_step();
          } else {
            micro_step();
          }
          loss_count += 1;
          tokens += static_cast<double>(y.numel()) / tp;  // a tp row's ranks share them
        }
        if (scaling) scaler.unscale_(*optimizer);
        if (grad_norm_clip > 0 && pp > 1) {
          clip_pipeline_grads(*stage_module, grad_norm_clip, *mesh->get_group("pp"));
        } else if (grad_norm_clip > 0) {
          if (split)
            ddp::clip_grad_norm_(model->parameters(), grad_norm_clip);
          else
            torch::nn::utils::clip_grad_norm_(model->parameters(), grad_norm_clip);
        }
        scaler.step(*optimizer);
        scaler.update();
        optimizer->zero_grad();
        ++step;
        stop = max_steps > 0 && step >= max_steps;
        const bool checkpoint_now = save_every > 0 && step % save_every == 0;
        // A checkpoint step is also a record, so that no partial interval is pending
        // in a checkpoint: a resumed run writes the records of an uninterrupted one.
        if (step % log_every == 0 || checkpoint_now) record(epoch, false);
        if (checkpoint_now && !stop) save(epoch);
      }
      if (epoch_done || stop) {
        // The epoch's end (or the last step): validation, a record, a checkpoint.
        record(epoch, true);
        save(epoch_done ? epoch + 1 : epoch);
      }
    }

    // Step 9: rank 0 alone saves the unwrapped model (sharded: every rank first gives its
    // rows), then samples from it.
    if (no_save) {
      if (rank == 0) {
        std::printf(
            "done: %lld steps in %s (--no-save: no checkpoint, no model)\n  metrics     %s\n",
            static_cast<long long>(step),
            fashion_mnist::format_duration(seconds_since(run_start)).c_str(), metrics_path.c_str());
        std::fflush(stdout);
      }
      ddp::destroy_process_group();
      return 0;
    }
    auto state = split ? ddp::full_state_dict(*model) : ddp::model_state_dict(*model);
    if (pp > 1) state = gather_stages(*stage_module, stage_index, dp_rank, out_dir);
    if (rank == 0) {
      const fs::path model_path = out_dir / "model.pt", plot_path = out_dir / "loss.svg";
      ddp::save_state_dict(state, model_path.string());
      gpt::write_loss_svg(plot_path.string(), history,
                          "GPT on " + fs::path(data).filename().string() + ", " +
                              std::to_string(world_size) + (world_size == 1 ? " rank" : " ranks"));
      if (sample_length > 0) {
        // A plain copy of the model: generation is rank 0's alone, and a sharded forward
        // would wait for the others.
        gpt::Gpt plain(config);
        ddp::load_model_state_dict(*plain, state);
        plain->to(device);
        const auto ids =
            gpt::generate(*plain, prompt_ids, sample_length, static_cast<uint64_t>(seed));
        std::printf("---- sample ----\n%s\n----------------\n", corpus.decode(ids).c_str());
      }
      const auto latest = ddp::latest_checkpoint(checkpoints);
      std::printf("done: %lld steps in %s\n"
                  "  metrics     %s\n"
                  "  plot        %s  (open it in a browser)\n"
                  "  model       %s  (Python: model.load_state_dict(torch.load(path)))\n"
                  "  checkpoint  %s  (--resume continues from it)\n",
                  static_cast<long long>(step),
                  fashion_mnist::format_duration(seconds_since(run_start)).c_str(),
                  metrics_path.c_str(), plot_path.c_str(), model_path.c_str(),
                  latest ? latest->c_str() : "(none)");
      std::fflush(stdout);
    }

    // Step 10: destroy_process_group.
    ddp::destroy_process_group();
    return 0;
  } catch (const c10::Error& e) {
    std::fflush(stdout);
    std::cerr << "gpt: error: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "gpt: error: " << e.what() << std::endl;
    return 1;
  }
}
