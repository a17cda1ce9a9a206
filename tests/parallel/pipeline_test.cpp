// Pipeline parallelism against one process's gradient accumulation: ScheduleGPipe and
// Schedule1F1B at 2 and 4 stages with 1, 2, 4 and 8 microbatches (and an uneven split),
// the same losses, last-stage outputs and gradients; forward only; a stage that throws
// stops every stage with an error naming it; a stage whose process dies stops the others;
// and each stage replicated over a second mesh dimension (2 x 2).

#include "support/harness.h"
#include "support/util.h"

#include <ddp/distributed/default_group.h>
#include <ddp/distributed/device_mesh.h>
#include <ddp/errors.h>
#include <ddp/fsdp/fully_shard.h>
#include <ddp/parallel/pipelining.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <unistd.h>

#include <map>

namespace pipeline_test {

namespace {

constexpr double kTol = 1e-5;  // float32 sums in another order (OpenBLAS, MKL): up to ~1e-6

torch::nn::Sequential make_model() {
  torch::nn::Sequential s(torch::nn::Linear(6, 10), torch::nn::Functional(at::tanh),
                          torch::nn::Linear(10, 10), torch::nn::Functional(at::tanh),
                          torch::nn::Linear(10, 10), torch::nn::Functional(at::tanh),
                          torch::nn::Linear(10, 10), torch::nn::Linear(10, 3));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  at::NoGradGuard no_grad;
  for (auto& p : s->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.4);
  return s;
}

at::Tensor data(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen);
}

at::Tensor mse(const at::Tensor& out, const at::Tensor& y) { return (out - y).pow(2).mean(); }

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double scale = std::max(1.0, want.abs().max().item<double>());
  const double diff = (got - want).abs().max().item<double>();
  EXPECT_LE(diff, kTol * scale) << what << ": max |difference| " << diff;
}

struct Reference {
  std::vector<at::Tensor> losses;
  at::Tensor output;
  std::map<std::string, at::Tensor> grads;
};

// One process: the microbatches' losses, each backward scaled by 1 / n (accumulation).
Reference reference(const at::Tensor& x, const at::Tensor& y, int n) {
  auto model = make_model();
  Reference r;
  const auto xs = at::tensor_split(x, n, 0), ys = at::tensor_split(y, n, 0);
  std::vector<at::Tensor> outs;
  for (int i = 0; i < n; ++i) {
    const at::Tensor out = model->forward(xs[i]);
    const at::Tensor loss = mse(out, ys[i]);
    (loss / n).backward();
    r.losses.push_back(loss.detach());
    outs.push_back(out.detach());
  }
  r.output = at::cat(outs, 0);
  for (const auto& p : model->named_parameters()) r.grads[p.key()] = p.value().grad();
  return r;
}

enum class Kind { kGPipe, k1F1B };

std::unique_ptr<ddp::PipelineSchedule> schedule(Kind kind, ddp::PipelineStage& stage, int n,
                                                ddp::PipelineLossFn loss) {
  if (kind == Kind::kGPipe) return std::make_unique<ddp::ScheduleGPipe>(stage, n, loss);
  return std::make_unique<ddp::Schedule1F1B>(stage, n, loss);
}

void check(Kind kind, int stages, int n, int64_t batch) {
  const at::Tensor x = data({batch, 6}, 10), y = data({batch, 3}, 11);
  const Reference ref = reference(x, y, n);
  const std::string at = std::string(kind == Kind::kGPipe ? "GPipe" : "1F1B") + ", " +
                         std::to_string(stages) + " stages, " + std::to_string(n) +
                         " microbatches, batch " + std::to_string(batch);
  ddp_test::run_thread_groups(stages, [&](ddp::ProcessGroup& pg) {
    auto model = make_model();
    auto slice = ddp::pipeline_slice(model, pg.rank(), stages);
    ddp::PipelineStage stage(slice, pg.rank(), stages, ddp_test::borrow(pg));
    auto sched = schedule(kind, stage, n, mse);
    std::vector<at::Tensor> losses;
    at::Tensor out;
    if (stage.is_first()) {
      out = sched->step(x);
    } else if (stage.is_last()) {
      out = sched->step({}, y, &losses);
    } else {
      out = sched->step();
    }
    const std::string on = at + ", stage " + std::to_string(pg.rank());
    if (stage.is_last()) {
      expect_close(out, ref.output, "output, " + on);
      ASSERT_EQ(losses.size(), static_cast<size_t>(n)) << on;
      for (int i = 0; i < n; ++i) expect_close(losses[i], ref.losses[i], "loss, " + on);
    } else {
      EXPECT_FALSE(out.defined()) << on;
    }
    for (const auto& p : slice->named_parameters()) {
      expect_close(p.value().grad(), ref.grads.at(p.key()), p.key() + " gradient, " + on);
    }
  });
}

}  // namespace

TEST(Pipeline, GPipeMatchesGradientAccumulation) {
  for (int stages : {2, 4}) {
    for (int n : {1, 2, 4, 8}) check(Kind::kGPipe, stages, n, 16);
  }
}

TEST(Pipeline, OneFOneBMatchesGradientAccumulation) {
  for (int stages : {2, 4}) {
    for (int n : {1, 2, 4, 8}) check(Kind::k1F1B, stages, n, 16);
  }
}

// 10 samples in 4 microbatches: 3, 3, 2, 2, as torch.tensor_split.
TEST(Pipeline, UnevenMicrobatches) {
  check(Kind::kGPipe, 3, 4, 10);
  check(Kind::k1F1B, 3, 4, 10);
}

TEST(Pipeline, SlicesAndStages) {
  auto model = make_model();
  EXPECT_EQ(ddp::pipeline_slice(model, 0, 3)->size(), 3u);  // 8 layers: 3, 3, 2
  EXPECT_EQ(ddp::pipeline_slice(model, 2, 3)->size(), 2u);
  EXPECT_EQ(ddp::pipeline_slice(model, 1, 2, {5})->size(), 3u);
  // The slice holds the model's own layers.
  EXPECT_EQ(ddp::pipeline_slice(model, 0, 4)->ptr(0).get(), model->ptr(0).get());
  EXPECT_ERROR_HAS(ddp_test::error_of([&] { ddp::pipeline_slice(model, 0, 9); }),
                   "8 layers cannot make 9 stages");
  EXPECT_ERROR_HAS(ddp_test::error_of([&] {
                     ddp::pipeline_slice(model, 0, 3, {4, 4});
                   }),
                   "must rise strictly");
  ddp_test::run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto mine = make_model();
    EXPECT_ERROR_HAS(ddp_test::error_of([&] {
                       ddp::PipelineStage(ddp::pipeline_slice(mine, 0, 3), pg.rank(), 3,
                                          ddp_test::borrow(pg));
                     }),
                     "3 stages on a group of 2 ranks");
    EXPECT_ERROR_HAS(ddp_test::error_of([&] {
                       ddp::PipelineStage(ddp::pipeline_slice(mine, 0, 2), 1 - pg.rank(), 2,
                                          ddp_test::borrow(pg));
                     }),
                     "stage i runs on the group's rank i");
  });
}

TEST(Pipeline, ForwardOnly) {
  const at::Tensor x = data({8, 6}, 12);
  const at::Tensor want = make_model()->forward(x).detach();
  ddp_test::run_thread_groups(4, [&](ddp::ProcessGroup& pg) {
    auto model = make_model();
    ddp::PipelineStage stage(ddp::pipeline_slice(model, pg.rank(), 4), pg.rank(), 4,
                             ddp_test::borrow(pg));
    ddp::ScheduleGPipe sched(stage, 4);
    const at::Tensor out = sched.step(stage.is_first() ? x : at::Tensor());
    if (stage.is_last()) expect_close(out, want, "forward-only output");
  });
}

namespace {

// Throws in its forward on the `fail_at`-th call.
struct FlakyImpl : torch::nn::Module {
  explicit FlakyImpl(int fail_at) : fail_at(fail_at) {}
  at::Tensor forward(const at::Tensor& x) {
    if (++calls == fail_at) throw std::runtime_error("the flaky layer gave up");
    return x * 2;
  }
  int fail_at;
  int calls = 0;
};
TORCH_MODULE(Flaky);

}  // namespace

// Stage 2 of 4 throws in its second forward (1F1B): every stage's step throws, the
// failing stage with its own error, the others naming stage 2; nothing waits.
TEST(Pipeline, AStageThatThrowsStopsEveryStage) {
  for (Kind kind : {Kind::kGPipe, Kind::k1F1B}) {
    std::vector<std::string> errors(4);
    ddp_test::run_thread_groups(4, [&](ddp::ProcessGroup& pg) {
      torch::nn::Sequential slice(torch::nn::Linear(6, 6));
      if (pg.rank() == 2) slice = torch::nn::Sequential(Flaky(2));
      ddp::PipelineStage stage(slice, pg.rank(), 4, ddp_test::borrow(pg));
      auto sched = schedule(kind, stage, 4, mse);
      const at::Tensor x = data({8, 6}, 1), y = data({8, 6}, 2);
      try {
        sched->step(stage.is_first() ? x : at::Tensor(), stage.is_last() ? y : at::Tensor());
      } catch (const ddp::ProcessGroupError& e) {
        errors[static_cast<size_t>(pg.rank())] = e.what();
      }
    });
    for (int r = 0; r < 4; ++r) {
      const std::string& e = errors[static_cast<size_t>(r)];
      if (r == 2) {
        EXPECT_ERROR_HAS(e, "pipeline stage 2 failed, and told the other stages");
        EXPECT_ERROR_HAS(e, "the flaky layer gave up");
      } else {
        EXPECT_ERROR_HAS(e, "stage 2 failed or is gone");
      }
    }
  }
}

// A process that dies mid-step (stage 1 of 3 exits in its second forward): stages 0 and
// 2 stop with an error instead of waiting (tests/parallel: pipeline_dies).
DDP_SCENARIO(pipeline_dies) {
  ddp::ProcessGroupGuard guard(
      ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(20)));
  const int rank = ddp::get_rank();
  torch::nn::Sequential slice(torch::nn::Linear(6, 6));
  if (rank == 1) {
    slice = torch::nn::Sequential(torch::nn::Functional([](const at::Tensor& x) {
      static int calls = 0;
      if (++calls == 2) ::_exit(9);
      return x;
    }));
  }
  ddp::PipelineStage stage(slice, rank, 3);
  ddp::Schedule1F1B sched(stage, 4, mse);
  try {
    sched.step(rank == 0 ? data({8, 6}, 1) : at::Tensor(),
               rank == 2 ? data({8, 6}, 2) : at::Tensor());
  } catch (const ddp::ProcessGroupError& e) {
    std::printf("rank %d: %s\n", rank, e.what());
    std::fflush(stdout);
    ::_exit(3);
  }
  return 0;
}

TEST(PipelineMultiProc, ARankThatDiesStopsTheOthers) {
  ddp_test::ProcessOptions options;
  options.timeout = std::chrono::seconds(90);
  const auto results = ddp_test::run_processes(3, "pipeline_dies", options);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[1].exit_code, 9) << results[1].output;
  for (int r : {0, 2}) {
    EXPECT_EQ(results[static_cast<size_t>(r)].exit_code, 3)
        << results[static_cast<size_t>(r)].output;
    EXPECT_NE(results[static_cast<size_t>(r)].output.find("stage 1 failed or is gone"),
              std::string::npos)
        << results[static_cast<size_t>(r)].output;
  }
}

// 2 x 2: two pipelines of two stages ("pp"), each stage replicated over its "dp" pair
// (replicate_over); two replicas' batches, 4 microbatches each; equal to one process
// accumulating both. A stage under fully_shard is refused with what to do instead.
TEST(Pipeline, ReplicatedOverDataParallelRanks) {
  const at::Tensor x0 = data({8, 6}, 20), y0 = data({8, 3}, 21);
  const at::Tensor x1 = data({8, 6}, 22), y1 = data({8, 3}, 23);
  // One process: both replicas' 4 microbatches, each loss / 8 (the average of the two).
  auto ref = make_model();
  for (const auto& [x, y] : {std::make_pair(x0, y0), std::make_pair(x1, y1)}) {
    const auto xs = at::tensor_split(x, 4, 0), ys = at::tensor_split(y, 4, 0);
    for (int i = 0; i < 4; ++i) (mse(ref->forward(xs[i]), ys[i]) / 8).backward();
  }
  std::map<std::string, at::Tensor> want;
  for (const auto& p : ref->named_parameters()) want[p.key()] = p.value().grad();
  ddp_test::run_thread_groups(4, [&](ddp::ProcessGroup& pg) {
    ddp::DeviceMesh mesh("cpu", at::arange(4, at::kLong).view({2, 2}), {"dp", "pp"},
                         ddp_test::borrow(pg));
    const int s = static_cast<int>(mesh.get_local_rank("pp"));
    const int replica = static_cast<int>(mesh.get_local_rank("dp"));
    auto model = make_model();
    auto slice = ddp::pipeline_slice(model, s, 2);
    ddp::PipelineStage stage(slice, s, 2, mesh.get_group("pp"));
    stage.replicate_over(mesh.get_group("dp"));
    for (Kind kind : {Kind::kGPipe, Kind::k1F1B}) {
      for (auto& p : slice->parameters()) p.mutable_grad() = at::Tensor();
      auto sched = schedule(kind, stage, 4, mse);
      if (s == 0) {
        sched->step(replica == 0 ? x0 : x1);
      } else {
        sched->step({}, replica == 0 ? y0 : y1);
      }
      for (const auto& p : slice->named_parameters()) {
        expect_close(p.value().grad(), want.at(p.key()),
                     p.key() + " gradient, stage " + std::to_string(s) + ", replica " +
                         std::to_string(replica));
      }
    }
    auto unit =
        ddp::fully_shard(model.ptr(), ddp::FullyShardOptions().process_group(mesh.get_group("dp")));
    EXPECT_ERROR_HAS(ddp_test::error_of(
                         [&] { ddp::PipelineStage(unit, s, 2, mesh.get_group("pp")); }),
                     "replicate_over(the data-parallel group)");
  });
}

}  // namespace pipeline_test

namespace pipeline_test {

// Against PyTorch's own torch.distributed.pipelining (ScheduleGPipe and Schedule1F1B,
// Gloo on CPUs) on the same model, weights and batch: each stage's gradients and the
// microbatches' losses (tests/parallel/python/pipeline_peer.py).
TEST(PipelinePython, EqualsTorchPipelining) {
  // Even microbatches: PyTorch's stages size their receive buffers from the first
  // microbatch, so a smaller last one fails there (ddp-cpp sends each shape).
  constexpr int kStages = 2, kMicro = 4, kBatch = 8;
  ddp_test::TempDir dir;
  auto init_model = make_model();
  std::vector<at::Tensor> flat;
  for (const auto& p : init_model->parameters()) flat.push_back(p.detach().reshape({-1}));
  ddp_test::write_bytes(dir.file("init.bin"), at::cat(flat));
  const at::Tensor x = data({kBatch, 6}, 30), y = data({kBatch, 3}, 31);
  ddp_test::write_bytes(dir.file("x.bin"), x);
  ddp_test::write_bytes(dir.file("y.bin"), y);
  std::string output;
  const int rc =
      ddp_test::run_command(std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                                "/tests/parallel/python/pipeline_peer.py " + dir.path() + " " +
                                std::to_string(kStages) + " " + std::to_string(kMicro) + " " +
                                std::to_string(kBatch) + " 2>&1",
                            &output);
  if (rc == 3) GTEST_SKIP() << output;
  ASSERT_EQ(rc, 0) << output;
  for (Kind kind : {Kind::kGPipe, Kind::k1F1B}) {
    const std::string name = kind == Kind::kGPipe ? "gpipe" : "1f1b";
    ddp_test::run_thread_groups(kStages, [&](ddp::ProcessGroup& pg) {
      auto model = make_model();
      auto slice = ddp::pipeline_slice(model, pg.rank(), kStages);
      ddp::PipelineStage stage(slice, pg.rank(), kStages, ddp_test::borrow(pg));
      auto sched = schedule(kind, stage, kMicro, mse);
      std::vector<at::Tensor> losses;
      if (stage.is_first()) {
        sched->step(x);
      } else {
        sched->step({}, y, &losses);
      }
      std::vector<at::Tensor> grads;
      for (const auto& p : slice->parameters()) grads.push_back(p.grad().reshape({-1}));
      const at::Tensor mine = at::cat(grads);
      const at::Tensor theirs =
          ddp_test::read_floats(dir.file("py_" + name + "_" + std::to_string(pg.rank()) + ".bin"),
                                {mine.numel()});
      expect_close(mine, theirs,
                   name + " gradients of stage " + std::to_string(pg.rank()) +
                       " against PyTorch's");
      if (stage.is_last()) {
        const at::Tensor py_losses =
            ddp_test::read_floats(dir.file("py_" + name + "_losses.bin"), {kMicro});
        expect_close(at::stack(losses), py_losses, name + " losses against PyTorch's");
      }
    });
  }
}

}  // namespace pipeline_test
