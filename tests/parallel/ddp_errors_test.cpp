// Misuse gives a clear error on every rank, never a crash or a hang. Messages are
// pinned by substring: what happened, which parameter, what to do.

#include "parallel/ddp_test_util.h"
#include "support/util.h"

#include <chrono>
#include <condition_variable>
#include <mutex>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace ddp_errors_test {

using ddp_test::error_of;
using ddp_test::options_for;
using ddp_test::run_thread_groups;

namespace {

// Lets threads wait until all of them reached a point (C++17 has no std::latch).
class Latch {
 public:
  explicit Latch(int count) : count_(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--count_ == 0) cv_.notify_all();
    cv_.wait(lock, [&] { return count_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_;
};

struct FrozenImpl : torch::nn::Module {
  FrozenImpl() : fc(register_module("fc", torch::nn::Linear(4, 4))) {
    for (auto& p : parameters()) p.set_requires_grad(false);
  }
  at::Tensor forward(const at::Tensor& x) { return fc(x); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Frozen);

struct Output {
  at::Tensor logits;
};

struct StructOutputImpl : torch::nn::Module {
  StructOutputImpl() : fc(register_module("fc", torch::nn::Linear(4, 4))) {}
  Output forward(const at::Tensor& x) { return Output{fc(x)}; }
  torch::nn::Linear fc;
};
TORCH_MODULE(StructOutput);

}  // namespace

TEST(MisuseTest, SecondBackwardWithoutForward) {
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp model;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    auto loss = dmodel(ddp_test::randn({4, 8}, pg.rank())).sum();
    loss.backward({}, /*retain_graph=*/true);
    const std::string msg = error_of([&] { loss.backward(); });
    EXPECT_ERROR_HAS(msg, "no forward through the DDP wrapper is waiting for its backward");
    EXPECT_ERROR_HAS(msg, "on rank " + std::to_string(pg.rank()) + " of 2");
    EXPECT_ERROR_HAS(msg, "no_sync()");
  });
}

TEST(MisuseTest, BackwardThroughTheWrappedModuleDirectly) {
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp model;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    const std::string msg = error_of([&] { model(ddp_test::randn({4, 8}, 1)).sum().backward(); });
    EXPECT_ERROR_HAS(msg, "a gradient arrived for parameter 'fc");
    EXPECT_ERROR_HAS(msg, "not the wrapped module directly");
  });
}

TEST(MisuseTest, ParameterMarkedReadyTwice) {
  // find_unused_parameters marks head_b unused (forward does not reach it), then the
  // loss uses it outside forward, so its gradient arrives after all.
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    ddp_test::BranchNet model;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg).find_unused_parameters(true));
    auto out = dmodel(ddp_test::randn({4, 8}, 2));
    auto loss = out.sum() + model->head_b->weight.pow(2).sum();
    const std::string msg = error_of([&] { loss.backward(); });
    EXPECT_ERROR_HAS(msg, "parameter 'head_b.weight' was marked ready twice in one backward");
    EXPECT_ERROR_HAS(msg, "used outside forward");
    // The failed backward is reported at the next forward instead of being ignored.
    const std::string next = error_of([&] { dmodel(ddp_test::randn({4, 8}, 3)); });
    EXPECT_ERROR_HAS(next, "the previous backward did not finish");
  });
}

TEST(MisuseTest, UnusedParameterWithoutTheFlagFailsAtNextForwardAndDoesNotHang) {
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    ddp_test::BranchNet model;  // head_b unused
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg).bucket_cap_mb(1e-6));
    dmodel(ddp_test::randn({4, 8}, 4)).sum().backward();  // completes
    const std::string msg = error_of([&] { dmodel(ddp_test::randn({4, 8}, 5)); });
    EXPECT_ERROR_HAS(msg, "expected the previous iteration's gradient reduction to have "
                          "finished before this forward, but 2 of 6 parameters got no "
                          "gradient in that backward: 'head_b.weight', 'head_b.bias'");
    EXPECT_ERROR_HAS(msg, "find_unused_parameters(true)");
  });
}

TEST(MisuseTest, ModuleWithoutTrainableParameters) {
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    Frozen frozen;
    const std::string msg =
        error_of([&] { (void)ddp::DistributedDataParallel(frozen, options_for(pg)); });
    EXPECT_ERROR_HAS(msg, "has no parameters that require grad (2 parameters, all frozen");
    const std::string none =
        error_of([&] { (void)ddp::DistributedDataParallel(torch::nn::ReLU(), options_for(pg)); });
    EXPECT_ERROR_HAS(none, "has no parameters that require grad (0 parameters");
  });
}

TEST(MisuseTest, ConstructedBeforeInitProcessGroup) {
  ASSERT_FALSE(ddp::is_initialized());
  ddp_test::Mlp model;
  const std::string msg = error_of([&] { (void)ddp::DistributedDataParallel(model); });
  EXPECT_ERROR_HAS(msg, "DistributedDataParallel needs a process group");
  EXPECT_ERROR_HAS(msg, "ddp::init_process_group()");
}

TEST(MisuseTest, BadOptionsNameTheValue) {
  run_thread_groups(1, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp model;
    EXPECT_ERROR_HAS(error_of([&] {
                       (void)ddp::DistributedDataParallel(model, options_for(pg).bucket_cap_mb(0));
                     }),
                     "bucket_cap_mb must be > 0, but got 0");
    EXPECT_ERROR_HAS(
        error_of([&] {
          (void)ddp::DistributedDataParallel(model, options_for(pg).device_ids({0, 1}));
        }),
        "device_ids must name at most one device (this process's), but got 2");
    EXPECT_ERROR_HAS(error_of([&] {
                       (void)ddp::DistributedDataParallel(model, options_for(pg).device_ids({0}));
                     }),
                     "device_ids is {0}, but parameter 'fc1.weight' is on cpu");
  });
}

TEST(MisuseTest, OutputTypeDdpCannotSearch) {
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    StructOutput model;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg).find_unused_parameters(true));
    const std::string msg = error_of([&] { dmodel(ddp_test::randn({2, 4}, 6)); });
    EXPECT_ERROR_HAS(msg, "forward returned a");
    EXPECT_ERROR_HAS(msg, "Output");
    EXPECT_ERROR_HAS(msg, "specialise ddp::OutputTensors");
    // Without the flag the output is never searched: any type works.
    auto plain = ddp::DistributedDataParallel(StructOutput(), options_for(pg));
    plain(ddp_test::randn({2, 4}, 7)).logits.sum().backward();
  });
}

TEST(MisuseTest, CommHookAfterFirstBackwardOrTwice) {
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp model;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    dmodel(ddp_test::randn({4, 8}, 8)).sum().backward();
    EXPECT_ERROR_HAS(error_of([&] {
                       dmodel->register_comm_hook(ddp::comm_hooks::fp16_compress_hook());
                     }),
                     "register_comm_hook('fp16_compress') must be called before the first "
                     "backward, but 1 iteration(s) were already reduced");

    ddp_test::Mlp other;
    auto d2 = ddp::DistributedDataParallel(other, options_for(pg));
    d2->register_comm_hook(ddp::comm_hooks::bf16_compress_hook());
    EXPECT_ERROR_HAS(error_of(
                         [&] { d2->register_comm_hook(ddp::comm_hooks::fp16_compress_hook()); }),
                     "a comm hook ('bf16_compress') is already registered");
  });
}

// ---- Ranks that disagree ------------------------------------------------------------

TEST(MismatchTest, DifferentShapeOnRank1IsReportedOnEveryRank) {
  run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp model(8, pg.rank() == 1 ? 17 : 16, 4);
    try {
      (void)ddp::DistributedDataParallel(model, options_for(pg));
      ADD_FAILURE() << "rank " << pg.rank() << " accepted mismatched models";
    } catch (const ddp::MismatchError& e) {
      const std::string msg = e.what();
      EXPECT_ERROR_HAS(msg, "Ranks differing from rank 0: 1.");
      EXPECT_ERROR_HAS(msg, "parameter 'fc1.weight' has shape [16, 8] Float (requires grad) "
                            "on rank 0 but shape [17, 8] Float (requires grad) on rank 1");
    }
  });
}

TEST(MismatchTest, ExtraParameterAndDifferentOptions) {
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    auto options = options_for(pg).bucket_cap_mb(pg.rank() == 0 ? 25 : 10);
    ddp_test::Mlp model;
    try {
      (void)ddp::DistributedDataParallel(model, options);
      ADD_FAILURE() << "accepted";
    } catch (const ddp::MismatchError& e) {
      EXPECT_ERROR_HAS(std::string(e.what()),
                       "option 'bucket_cap_mb' has = 25 on rank 0 but = 10 on rank 1");
    }
  });
  run_thread_groups(2, [&](ddp::ProcessGroup& pg) {
    torch::nn::Sequential seq(torch::nn::Linear(4, 4));
    if (pg.rank() == 1) seq->push_back(torch::nn::Linear(4, 4));
    try {
      (void)ddp::DistributedDataParallel(seq, options_for(pg));
      ADD_FAILURE() << "accepted";
    } catch (const ddp::MismatchError& e) {
      EXPECT_ERROR_HAS(std::string(e.what()), "rank 0 has 2 parameters, rank 1 has 4; "
                                              "parameter '1.weight' exists only on rank 1");
    }
  });
}

TEST(MismatchTest, RankThatNeverConstructsGivesTimeoutOnTheOthers) {
  const auto timeout = std::chrono::seconds(3);
  Latch done(3);
  const auto start = std::chrono::steady_clock::now();
  run_thread_groups(
      3,
      [&](ddp::ProcessGroup& pg) {
        if (pg.rank() == 2) {  // never constructs DDP; stays connected meanwhile
          done.arrive_and_wait();
          return;
        }
        ddp_test::Mlp model;
        try {
          (void)ddp::DistributedDataParallel(model, options_for(pg));
          ADD_FAILURE() << "rank " << pg.rank() << " constructed without rank 2";
        } catch (const ddp::TimeoutError& e) {
          EXPECT_ERROR_HAS(std::string(e.what()),
                           "for every rank to describe its model at construction");
        } catch (const std::exception& e) {
          ADD_FAILURE() << "rank " << pg.rank() << ": expected TimeoutError, got " << e.what();
        }
        done.arrive_and_wait();
      },
      timeout);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::seconds(30));
}

}  // namespace ddp_errors_test
