// Fashion-MNIST on every core or GPU you have: PyTorch's DDP lesson, step by step, in C++.
//
//   build/bin/ddprun --nproc-per-node 2 -- build/bin/fashion_mnist
//
// Each "Step N" comment below marks where the lesson's step happens:
//    1  launch one process per device with the launcher (ddprun, like torchrun)
//    2  each process knows its rank, the world size and its local rank
//    3  init_process_group: "nccl" for GPUs, shared memory or "gloo" for CPUs
//    4  pin each process to its device by local rank
//    5  wrap the model in DistributedDataParallel
//    6  backward averages the gradients across processes
//    7  a DistributedSampler gives each process a disjoint slice of the data
//    8  set_epoch reshuffles every epoch
//    9  rank 0 alone saves the unwrapped model
//   10  destroy_process_group
//
// Everything else is what a real training script needs: Fashion-MNIST from Debian's
// dataset-fashion-mnist package, evaluation on the whole test set split across ranks, a
// progress bar, metrics in runs/<name>/metrics.jsonl, a plot (curves.svg), checkpoints
// every epoch and --resume, and --amp for mixed precision. Helpers live in
// examples/fashion_mnist/.

#include <ddp/ddp.h>

#include <CLI/CLI.hpp>

#include "common/cli_checks.h"
#include <torch/torch.h>

#include "fashion_mnist/allocator.h"
#include "fashion_mnist/idx.h"
#include "fashion_mnist/metrics.h"
#include "fashion_mnist/plot.h"
#include "fashion_mnist/progress.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace fashion_mnist;

// ---- The model ------------------------------------------------------------------------
// Two conv blocks and two linear layers: ~91% test accuracy after 8 epochs. Submodule
// names are Python's attribute names, so the state dict reads "conv1.weight", ... and
// loads into the same nn.Module written in Python.

struct NetImpl : torch::nn::Module {
  // batch_norm (--sync-bn): a SyncBatchNorm after each convolution, normalising with
  // the statistics of the global batch (all ranks' samples); plain BatchNorm when
  // there is one rank.
  explicit NetImpl(bool batch_norm = false)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)))),
        fc1(register_module("fc1", torch::nn::Linear(64 * 5 * 5, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {
    if (batch_norm) {
      bn1 = register_module("bn1", ddp::SyncBatchNorm(32));
      bn2 = register_module("bn2", ddp::SyncBatchNorm(64));
    }
  }

  torch::Tensor forward(torch::Tensor x) {  // [B, 1, 28, 28]
    x = conv1(x);                           // [B, 32, 26, 26]
    if (bn1) x = bn1(x);
    x = torch::max_pool2d(torch::relu(x), 2);  // [B, 32, 13, 13]
    x = conv2(x);                              // [B, 64, 11, 11]
    if (bn2) x = bn2(x);
    x = torch::max_pool2d(torch::relu(x), 2);  // [B, 64, 5, 5]
    x = torch::relu(fc1(x.flatten(1)));        // [B, 128]
    x = torch::dropout(x, /*p=*/0.25, /*train=*/is_training());
    return fc2(x);  // [B, 10] logits
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
  ddp::SyncBatchNorm bn1{nullptr}, bn2{nullptr};
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  // Before any tensor exists. Without it the first epoch runs 3-4x slower on a CPU:
  // Note [Page faults in the first epoch] in fashion_mnist/allocator.h.
  keep_freed_memory();

  // ---- Options ------------------------------------------------------------------------
  CLI::App app{"Train a CNN on Fashion-MNIST with DistributedDataParallel.\n"
               "Run it with a launcher, one process per device:\n"
               "  ddprun --nproc-per-node 2 -- fashion_mnist"};
  int64_t epochs = 8, batch_size = 64, seed = 42, train_samples = 0, test_samples = 0;
  double lr = 2e-3;
  int threads = 0, timeout_s = 1800;
  std::string backend, data_dir = kDefaultDataDir, run_dir = "runs", name = "fashion_mnist";
  std::string progress_flag = "auto";
  bool resume = false, trace = false, amp = false, sync_bn = false, fsdp = false;
  int64_t powersgd_rank = 0, powersgd_start = 1000;
  app.add_option("--epochs", epochs, "Epochs to train (in all, also with --resume)")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--batch-size", batch_size, "Samples per batch on each rank")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--lr", lr, "Adam learning rate")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--seed", seed, "Seed of the model's initial weights and of the shuffle")
      ->capture_default_str();
  app.add_option("--threads", threads,
                 "Torch threads per rank; 0: torch's default, which "
                 "follows OMP_NUM_THREADS (ddprun sets it to cores / processes)")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_option("--backend", backend, examples::kBackendHelp)
      ->check(CLI::IsMember({"", "gloo", "nccl", "shm"}));
  app.add_option("--timeout", timeout_s,
                 "Seconds a rank waits for the others in a collective before it fails")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--data-dir", data_dir, "Folder with the four *-ubyte.gz files")
      ->capture_default_str();
  app.add_option("--train-samples", train_samples,
                 "Use only the first N training images; "
                 "0: all 60000")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_option("--test-samples", test_samples,
                 "Use only the first N test images; "
                 "0: all 10000")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_option("--run-dir", run_dir, "Parent folder of the run's folder")->capture_default_str();
  app.add_option("--name", name, "The run's folder: <run-dir>/<name>")->capture_default_str();
  app.add_option("--progress", progress_flag,
                 "auto (bar on a terminal, else plain), bar, "
                 "plain (a line every 10%) or none")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bar", "plain", "none"}));
  app.add_flag("--resume", resume, "Continue from the latest checkpoint in <run-dir>/<name>");
  std::string checkpoint_format;
  app.add_option("--checkpoint-format", checkpoint_format, examples::kCheckpointFormatHelp)
      ->check(CLI::IsMember({"", "file", "dcp"}));
  app.add_flag("--amp", amp,
               "Mixed precision: the forward pass in bfloat16 on a CPU, in "
               "float16 with a gradient scaler on a GPU (weights and gradients stay float32)");
  app.add_flag("--sync-bn", sync_bn,
               "Add a SyncBatchNorm after each convolution: batch "
               "statistics over all ranks' samples");
  auto* fsdp_flag = app.add_flag(
      "--fsdp", fsdp,
      "Shard the model with ddp::fully_shard instead of replicating it with DDP: each rank "
      "keeps 1/N of the weights, gradients and Adam state (checkpoints stay whole)");
  auto* powersgd_flag =
      app.add_option("--powersgd-rank", powersgd_rank,
                     "Compress DDP's gradients with PowerSGD of this rank (ddp::powersgd_hook; "
                     "for slow links between hosts); 0: off")
          ->capture_default_str()
          ->check(examples::kNonNegative)
          ->excludes(fsdp_flag);
  app.add_option("--powersgd-start", powersgd_start,
                 "With --powersgd-rank: plain all-reduce for the steps before this one")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(2), std::numeric_limits<int64_t>::max()))
      ->needs(powersgd_flag);
  app.add_flag("--trace", trace,
               "Write a Chrome trace per rank to "
               "<run-dir>/<name>/trace-rank<r>.json (open in ui.perfetto.dev)")
      ->excludes(fsdp_flag);
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) torch::set_num_threads(threads);
  const fs::path out_dir = fs::path(run_dir) / name;

  try {
    // Step 1: launch one process per device with the launcher. ddprun (like torchrun)
    // started this process and its peers: `ddprun --nproc-per-node 2 -- fashion_mnist`.

    // Step 2: each process knows its rank, the world size and its local rank, from the
    // launcher's RANK, WORLD_SIZE and LOCAL_RANK. Without a launcher: rank 0 of 1.
    const ddp::RankInfo me = ddp::rank_info_from_env();

    // Step 3: init_process_group. An empty backend picks "nccl" when this process sees a
    // GPU; on CPUs, shared memory ("shm") when every rank is on this host, else Gloo
    // between the hosts (--backend's help gives the whole rule).
    // The guard also destroys the group if we exit by an error, so no peer is left
    // waiting for us.
    ddp::ProcessGroupGuard group(ddp::InitOptions()
                                     .backend(backend)
                                     .rank(me.rank)
                                     .world_size(me.world_size)
                                     .local_rank(me.local_rank)
                                     .timeout(std::chrono::seconds(timeout_s)));
    const int rank = ddp::get_rank();
    const int world_size = ddp::get_world_size();

    // Step 4: pin each process to its device by local rank: cuda:<local rank> under
    // nccl, the CPU under gloo.
    const torch::Device device = ddp::get_device();

    // The data. Every rank reads the files; the sampler below decides who trains on what.
    const Split train = load_split(data_dir, /*train=*/true, train_samples);
    const Split test = load_split(data_dir, /*train=*/false, test_samples);

    fs::create_directories(out_dir);  // on every host: traces are written per rank

    torch::manual_seed(seed);  // the same initial weights everywhere (DDP checks this)
    Net model(sync_bn);
    model->to(device);

    // Step 5: wrap the model in DistributedDataParallel. This broadcasts rank 0's
    // weights, so every rank starts from the same model. (--fsdp: ddp::fully_shard
    // instead; every rank keeps its rows of each weight, and the model's own
    // parameters become those shards.)
    std::shared_ptr<torch::nn::Module> wrapped;    // train(), eval() and parameters()
    std::shared_ptr<ddp::PowerSGDState> powersgd;  // --powersgd-rank: in checkpoints too
    std::function<torch::Tensor(const torch::Tensor&)> forward;
    if (fsdp) {
      auto unit = ddp::fully_shard(model.ptr());
      wrapped = unit.ptr();
      forward = [unit](const torch::Tensor& x) mutable { return unit(x); };
    } else {
      auto options = ddp::DistributedDataParallelOptions();
      if (device.is_cuda()) options.device_ids({device.index()});
      if (trace) options.trace_path((out_dir / "trace-rank{rank}.json").string());
      auto dmodel = ddp::DistributedDataParallel(model, options);
      if (powersgd_rank > 0) {
        // PyTorch's powerSGD_hook: rank-r approximations of each weight's gradient from
        // step --powersgd-start on, with error feedback and warm start.
        powersgd =
            std::make_shared<ddp::PowerSGDState>(ddp::PowerSGDState()
                                                     .matrix_approximation_rank(powersgd_rank)
                                                     .start_powerSGD_iter(powersgd_start));
        dmodel->register_comm_hook(ddp::powersgd_hook(powersgd));
      }
      wrapped = dmodel.ptr();
      forward = [dmodel](const torch::Tensor& x) mutable { return dmodel->forward(x); };
    }
    torch::manual_seed(seed + rank);  // but each rank its own dropout masks

    torch::optim::Adam optimizer(wrapped->parameters(), torch::optim::AdamOptions(lr));

    // --amp: autocast runs the convolutions and linear layers in lower precision. float16
    // (GPU) needs the gradient scaler, or small gradients underflow to zero; bfloat16
    // (CPU) has float32's range and needs none, so there the scaler is disabled and its
    // calls below pass straight through. Every rank skips the same steps: after DDP's
    // all-reduce all ranks check the same gradients.
    const ddp::amp::AutocastOptions autocast = ddp::amp::AutocastOptions().enabled(amp).dtype(
        device.is_cuda() ? torch::kHalf : torch::kBFloat16);
    // (Sharded, each rank checks only its rows: the scaler then agrees over the group.)
    ddp::amp::GradScaler scaler(ddp::amp::GradScalerOptions()
                                    .enabled(amp && device.is_cuda())
                                    .process_group(fsdp ? ddp::default_group() : nullptr));

    // Step 7: the DistributedSampler hands each rank a disjoint slice of the training
    // set (a different one every epoch, the same permutation on every rank).
    ddp::DistributedSampler sampler(static_cast<size_t>(train.size()),
                                    ddp::DistributedSamplerOptions().seed(seed));

    if (rank == 0) {
      std::printf("fashion_mnist: %d rank(s), backend %s, device %s, %d thread(s) per rank\n"
                  "  %lld train / %lld test images from %s\n"
                  "  %lld epochs, batch %lld per rank (%lld in all), Adam lr %g%s\n",
                  world_size, ddp::default_group()->backend().c_str(), device.str().c_str(),
                  at::get_num_threads(), static_cast<long long>(train.size()),
                  static_cast<long long>(test.size()), data_dir.c_str(),
                  static_cast<long long>(epochs), static_cast<long long>(batch_size),
                  static_cast<long long>(batch_size * world_size), lr,
                  !amp               ? ""
                  : device.is_cuda() ? ", mixed precision (float16, gradient scaler)"
                                     : ", mixed precision (bfloat16)");
      std::fflush(stdout);
    }

    // Checkpoints every epoch, for --resume: model, optimizer, epoch, sampler, RNG (and
    // with --amp the gradient scaler's scale and growth tracker).
    // With --fsdp, DCP folders: each rank writes its own shards, nothing gathered.
    const ddp::CheckpointOptions checkpoints =
        ddp::CheckpointOptions((out_dir / "checkpoints").string())
            .format(examples::checkpoint_format(checkpoint_format, fsdp));
    ddp::Checkpoint checkpoint(*model);
    checkpoint.optimizer(&optimizer).sampler(&sampler);
    if (amp) checkpoint.grad_scaler(&scaler);
    if (powersgd) checkpoint.powersgd(powersgd.get());
    std::vector<EpochMetrics> history;
    const fs::path metrics_path = out_dir / "metrics.jsonl";
    int64_t start_epoch = 0, step = 0;
    // A fresh run replaces the previous run of the same name.
    if (rank == 0 && !resume) fs::remove_all(out_dir / "checkpoints");
    ddp::barrier();
    if (resume) {
      if (auto path = ddp::load_latest_checkpoint(checkpoints, checkpoint)) {
        start_epoch = checkpoint.epoch();
        step = checkpoint.step();
        for (const auto& m : read_metrics(metrics_path.string()))
          if (m.epoch <= start_epoch) history.push_back(m);
        if (rank == 0)
          std::printf("resuming from %s: %lld of %lld epochs done\n", path->c_str(),
                      static_cast<long long>(start_epoch), static_cast<long long>(epochs));
      } else if (rank == 0) {
        std::printf("no checkpoint in %s; starting from epoch 1\n",
                    checkpoints.directory().c_str());
      }
      std::fflush(stdout);
    }

    // The test set is split into contiguous shards, one per rank. (A DistributedSampler
    // would pad the set to a multiple of the world size by repeating images, and those
    // would be counted twice.) Each image is counted exactly once.
    const int64_t test_begin = test.size() * rank / world_size;
    const int64_t test_end = test.size() * (rank + 1) / world_size;

    const ProgressMode progress_mode = parse_progress_mode(progress_flag);
    const auto run_start = std::chrono::steady_clock::now();
    for (int64_t epoch = start_epoch; epoch < epochs; ++epoch) {
      const auto epoch_start = std::chrono::steady_clock::now();

      // Step 8: set_epoch reshuffles: without it every epoch would repeat epoch 0's order.
      sampler.set_epoch(epoch);
      const int64_t epoch_samples = static_cast<int64_t>(sampler.total_size());
      EpochProgress progress(rank == 0 ? progress_mode : ProgressMode::kNone, epoch + 1, epochs,
                             epoch_samples);

      // ---- Train ----
      wrapped->train();
      double loss_sum = 0;
      int64_t batches = 0, samples = 0;
      while (auto indices = sampler.next(static_cast<size_t>(batch_size))) {
        const auto index = torch::tensor(std::vector<int64_t>(indices->begin(), indices->end()));
        const auto x = normalize(train.images.index_select(0, index)).to(device);
        const auto y = train.labels.index_select(0, index).to(device);

        optimizer.zero_grad();
        torch::Tensor logits;
        {
          // Only the forward pass runs under autocast (a no-op without --amp).
          ddp::amp::AutocastGuard guard(device.type(), autocast);
          logits = forward(x);
        }
        const auto loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), y);
        // Step 6: backward averages the gradients across ranks, bucket by bucket, while
        // it is still computing; after it every rank holds the same gradients.
        // (The scaler multiplies the loss first and divides the gradients before the
        // step; it skips a step whose gradients overflowed. Disabled, it just steps.)
        scaler.scale(loss).backward();
        scaler.step(optimizer);
        scaler.update();
        ++step;

        loss_sum += loss.item<double>();
        batches += 1;
        samples += x.size(0);
        progress.update(samples * world_size, loss_sum / batches);
      }
      progress.finish();
      const double train_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();

      // ---- Evaluate on the whole test set: each rank its shard, then sum the counts ----
      wrapped->eval();
      int64_t correct = 0;
      {
        torch::NoGradGuard no_grad;
        // Batches of 128: LibTorch 1.13's CPU convolution takes a path 4-10x slower from
        // batch 256 on, and evaluation would then cost as much as training.
        for (int64_t i = test_begin; i < test_end; i += 128) {
          const int64_t n = std::min<int64_t>(128, test_end - i);
          const auto x = normalize(test.images.narrow(0, i, n)).to(device);
          const auto y = test.labels.narrow(0, i, n).to(device);
          // The unwrapped module: evaluation needs no gradient synchronisation. (A sharded
          // model runs through its unit, which gathers the weights for the forward.)
          const auto logits = fsdp ? forward(x) : model->forward(x);
          correct += logits.argmax(1).eq(y).sum().item<int64_t>();
        }
      }
      // [loss sum, batches, samples, correct, test images seen] summed over ranks. The
      // collective takes tensors on this rank's device (NCCL reads nothing else), so
      // the host's numbers go there and the sums come back.
      auto totals = torch::tensor({loss_sum, double(batches), double(samples), double(correct),
                                   double(test_end - test_begin)},
                                  torch::kDouble)
                        .to(device);
      ddp::all_reduce(totals, ddp::ReduceOp::SUM);
      const auto summed = totals.cpu();
      const auto t = summed.accessor<double, 1>();
      TORCH_INTERNAL_ASSERT(int64_t(t[4]) == test.size(), "evaluated ", t[4], " of ", test.size(),
                            " test images");

      EpochMetrics m;
      m.epoch = epoch + 1;
      m.train_loss = t[0] / t[1];
      m.test_accuracy = t[3] / double(test.size());
      m.samples_per_s = t[2] / train_seconds;
      m.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
      m.world_size = world_size;
      history.push_back(m);

      // Every epoch ends with the metrics, then a checkpoint (collective: rank 0 writes
      // the file, the others contribute their sampler positions and RNG states). In this
      // order a kill between the two loses nothing: the resumed run redoes the epoch
      // from the previous checkpoint and drops the records after it; the other way
      // round the checkpoint would say the epoch is done while its record was lost.
      if (rank == 0) write_metrics(metrics_path.string(), history);
      ddp::save_checkpoint(checkpoints, checkpoint.epoch(epoch + 1).step(step));
      if (rank == 0) {
        std::printf("epoch %*lld/%lld  train loss %.4f  test accuracy %6.2f%%  "
                    "%6.0f samples/s  %s\n",
                    epoch_width(epochs), static_cast<long long>(m.epoch),
                    static_cast<long long>(epochs), m.train_loss, 100 * m.test_accuracy,
                    m.samples_per_s, format_duration(m.seconds).c_str());
        std::fflush(stdout);
      }
    }

    // Step 9: rank 0 alone saves the unwrapped model (model, not dmodel, so the keys
    // read "conv1.weight", not "module.conv1.weight"). Python reads it with
    // torch.load(path) and load_state_dict. (Sharded, every rank first gives its rows.)
    const fs::path model_path = out_dir / "model.pt";
    const auto state = fsdp ? ddp::full_state_dict(*model) : ddp::model_state_dict(*model);
    if (rank == 0) {
      ddp::save_state_dict(state, model_path.string());
      const fs::path plot_path = out_dir / "curves.svg";
      write_curves_svg(plot_path.string(), history,
                       "Fashion-MNIST, " + std::to_string(world_size) +
                           (world_size == 1 ? " rank" : " ranks"));
      const double total =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      const auto latest = ddp::latest_checkpoint(checkpoints);
      std::printf("done: test accuracy %.2f%% after %lld epoch%s (%s)\n"
                  "  metrics     %s\n"
                  "  plot        %s  (open it in a browser)\n"
                  "  model       %s  (Python: model.load_state_dict(torch.load(path)))\n"
                  "  checkpoint  %s  (--resume continues from it)\n",
                  history.empty() ? 0.0 : 100 * history.back().test_accuracy,
                  static_cast<long long>(epochs), epochs == 1 ? "" : "s",
                  format_duration(total).c_str(), metrics_path.c_str(), plot_path.c_str(),
                  model_path.c_str(), latest ? latest->c_str() : "(none)");
      std::fflush(stdout);
    }

    // Step 10: destroy_process_group. (The guard would do it at scope exit anyway.)
    ddp::destroy_process_group();
    return 0;
  } catch (const c10::Error& e) {  // a caller mistake (LibTorch's or ddp's TORCH_CHECK):
                                   // the message without its backtrace
    std::fflush(stdout);
    std::cerr << "fashion_mnist: error: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {  // ddp::TimeoutError, ProcessGroupError, ...
    std::fflush(stdout);
    std::cerr << "fashion_mnist: error: " << e.what() << std::endl;
    return 1;
  }
}
