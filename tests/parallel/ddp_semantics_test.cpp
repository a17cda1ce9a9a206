// The cases where ranks could silently end with different gradients, or a rank could
// block, each at 2 and 3 ranks: device discipline of the bookkeeping collectives,
// no_sync mixed with a synced forward, parameters changed after wrapping, reentrant
// backward (activation checkpointing), ranks missing different parameters, world size
// 1, lifetimes and failures, parameter layouts, undefined gradients, non-leaf
// parameters. Expectations come from single-process LibTorch on the whole batch or from
// closed forms.

#include "parallel/ddp_test_util.h"
#include "support/util.h"

#include "distributed/comm.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/embedding.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace ddp_semantics_test {

using ddp_test::borrow;
using ddp_test::error_of;
using ddp_test::options_for;
using ddp_test::run_thread_groups;

namespace {

constexpr int64_t kPerRank = 4;
constexpr double kRtol = 1e-5;

std::string rank_tag(int rank, int world) {
  return "on rank " + std::to_string(rank) + " of " + std::to_string(world);
}

// ---- Device discipline ----------------------------------------------------------------

// A comm double whose device is "another device" (it reports cuda:local_rank while its
// tensors really live on the host), wrapping a real Gloo group. It checks what NCCL
// needs of ddp-cpp's bookkeeping collectives (integer tensors: sizes, orders, counts,
// bytes; gradients and parameters are the user's tensors on their own device):
//  - each one was moved with to_device() before the collective, else the call fails;
//  - its result is readable only through to_host() after the collective's wait(): the
//    wait overwrites the tensor itself with garbage, as reading device memory from the
//    host would give, and to_host() before the wait fails.
using ddp::detail::PendingWork;

class OtherDeviceComm final : public ddp::detail::Comm {
 public:
  explicit OtherDeviceComm(std::unique_ptr<Comm> inner)
      : Comm(inner->config()), inner_(std::move(inner)) {}

  c10::Device device() const override {
    return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(config().local_rank));
  }

  at::Tensor to_device(const at::Tensor& t) override {
    std::lock_guard<std::mutex> lock(mu_);
    at::Tensor moved = t.clone();
    staged_[moved.unsafeGetTensorImpl()] = moved;
    ++moved_;
    return moved;
  }

  at::Tensor to_host(const at::Tensor& t) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = results_.find(t.unsafeGetTensorImpl());
    TORCH_CHECK(it != results_.end(),
                "test double: to_host() of a tensor that no waited "
                "collective produced (read before wait, or never moved to the device)");
    at::Tensor host = it->second;
    results_.erase(it);
    ++read_back_;
    return host;
  }

  std::shared_ptr<ddp::detail::PendingWork> all_reduce(std::vector<at::Tensor>& tensors,
                                                       ddp::ReduceOp op) override {
    require_staged("all_reduce", tensors);
    return track(inner_->all_reduce(tensors, op), tensors);
  }
  std::shared_ptr<ddp::detail::PendingWork> broadcast(std::vector<at::Tensor>& tensors,
                                                      int src) override {
    require_staged("broadcast", tensors);
    return track(inner_->broadcast(tensors, src), tensors);
  }
  std::shared_ptr<ddp::detail::PendingWork> all_gather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs) override {
    require_staged("all_gather", inputs);
    return track(inner_->all_gather(outputs, inputs), outputs[0]);
  }
  void barrier() override { inner_->barrier(); }
  void shutdown() override { inner_->shutdown(); }

  int moved() const { return moved_; }
  int read_back() const { return read_back_; }
  /// Results of waited collectives that nobody read through to_host().
  size_t unread() {
    std::lock_guard<std::mutex> lock(mu_);
    return results_.size();
  }

 protected:
  bool accepts(const c10::Device&) const override { return true; }

 private:
  class Work final : public ddp::detail::PendingWork {
   public:
    Work(OtherDeviceComm* owner, std::shared_ptr<PendingWork> inner,
         std::vector<at::Tensor> results)
        : owner_(owner), inner_(std::move(inner)), results_(std::move(results)) {}
    void wait() override {
      inner_->wait();
      owner_->land(results_);
    }
    c10::intrusive_ptr<c10::ivalue::Future> future() override { return inner_->future(); }

   private:
    OtherDeviceComm* owner_;
    std::shared_ptr<PendingWork> inner_;
    std::vector<at::Tensor> results_;
  };

  static bool bookkeeping(const at::Tensor& t) {
    return at::isIntegralType(t.scalar_type(), /*includeBool=*/false);
  }

  void require_staged(const char* what, const std::vector<at::Tensor>& tensors) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& t : tensors) {
      if (!bookkeeping(t)) continue;
      TORCH_CHECK(staged_.count(t.unsafeGetTensorImpl()) > 0, "test double: ", what, " got a ",
                  t.scalar_type(),
                  " tensor that was not moved to the group's "
                  "device with to_device()");
    }
  }

  std::shared_ptr<PendingWork> track(std::shared_ptr<PendingWork> work,
                                     const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> results;
    for (const auto& t : tensors) {
      if (bookkeeping(t)) results.push_back(t);
    }
    if (results.empty()) return work;
    return std::make_shared<Work>(this, std::move(work), std::move(results));
  }

  // The collective finished "on the device": the host copy holds the values, the
  // tensor itself reads as garbage.
  void land(const std::vector<at::Tensor>& results) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& t : results) {
      results_[t.unsafeGetTensorImpl()] = t.clone();
      t.fill_(90);
    }
  }

  std::unique_ptr<Comm> inner_;
  std::mutex mu_;
  std::map<const void*, at::Tensor> staged_;
  std::map<const void*, at::Tensor> results_;
  int moved_ = 0;
  int read_back_ = 0;
};

ddp::detail::CommConfig gloo_config(const ddp_test::TempDir& dir, int rank, int world) {
  ddp::detail::CommConfig c;
  c.backend = "gloo";
  c.rank = rank;
  c.world_size = world;
  c.local_rank = rank;
  c.local_world_size = world;
  c.timeout = std::chrono::seconds(30);
  c.store = ddp::detail::CommConfig::StoreKind::kFile;
  c.store_path = dir.file("store");
  c.init_method = "file://" + c.store_path;
  c.gloo_address = "127.0.0.1";
  return c;
}

class DeviceDisciplineTest : public ::testing::TestWithParam<int> {};

TEST_P(DeviceDisciplineTest, BookkeepingCollectivesMoveTheirTensorsAndReadBackAfterWait) {
  const int world = GetParam();
  ddp_test::TempDir dir;
  const at::Tensor x = ddp_test::randn({world * kPerRank, 8}, 3);
  const at::Tensor y = ddp_test::randn({world * kPerRank, 4}, 4);
  ddp_test::run_threads(world, [&](int rank) {
    auto owned =
        std::make_unique<OtherDeviceComm>(ddp::detail::Comm::create(gloo_config(dir, rank, world)));
    OtherDeviceComm* comm = owned.get();
    auto pg = ddp::detail::make_process_group(std::move(owned));
    EXPECT_EQ(pg->device(),
              c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(rank)));

    // all_gather_bytes: the consensus of checkpoints, samplers and the model check.
    const std::string mine(static_cast<size_t>(3 + 5 * rank), static_cast<char>('a' + rank));
    const auto all = pg->all_gather_bytes(mine);
    ASSERT_EQ(all.size(), static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(all[r], std::string(static_cast<size_t>(3 + 5 * r), static_cast<char>('a' + r)));
    }

    // DDP: the model check, the bucket rebuild (rank 0's order) and, with
    // find_unused_parameters, the per-parameter use counts.
    for (bool find_unused : {false, true}) {
      ddp_test::BranchNet ref, model;
      ddp_test::init_params(*ref, 7);
      ddp_test::init_params(*model, 7);
      ref->use_b = model->use_b = true;
      const auto want = ddp_test::grads_after(*ref, [&] { return ddp_test::mse(ref(x), y); });
      auto dmodel = ddp::DistributedDataParallel(model, ddp::DistributedDataParallelOptions()
                                                            .process_group(pg)
                                                            .bucket_cap_mb(1e-4)
                                                            .find_unused_parameters(find_unused));
      for (int step = 0; step < 3; ++step) {
        for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
        ddp_test::mse(dmodel(ddp_test::shard(x, rank, kPerRank)),
                      ddp_test::shard(y, rank, kPerRank))
            .backward();
        ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, kRtol,
                                     "step " + std::to_string(step));
      }
    }
    // 2 gathers for the bytes, 2 per model check, 1 rebuild broadcast per model, use
    // counts per backward with find_unused_parameters (no rebuild then). The 3 use
    // counts are not read back: every parameter is used here, so no rank needs the sums
    // (Note [Lazy use counts]).
    EXPECT_GE(comm->moved(), 2 + 2 * 2 + 1 + 3);
    EXPECT_GE(comm->read_back() + 3, comm->moved());
    EXPECT_EQ(comm->unread(), 0u) << "a result was read without to_host()";
    pg->shutdown();
  });
}

TEST_P(DeviceDisciplineTest, ACollectiveOnAWrongDeviceNamesTheCall) {
  run_thread_groups(GetParam(), [&](ddp::ProcessGroup& pg) {
    at::Tensor meta = at::empty({4}, at::TensorOptions().device(c10::DeviceType::Meta));
    const std::string msg = error_of([&] { pg.all_reduce(meta); });
    EXPECT_ERROR_HAS(msg, "all_reduce on rank " + std::to_string(pg.rank()));
    EXPECT_ERROR_HAS(msg, "tensor 0 is on meta");
    EXPECT_ERROR_HAS(msg, "take tensors on cpu");
    // The group still works: nothing was sent.
    at::Tensor t = at::ones({2});
    pg.all_reduce(t);
    EXPECT_EQ(t[0].item<float>(), static_cast<float>(pg.size()));
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeviceDisciplineTest, ::testing::Values(2, 3),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// ---- Models ---------------------------------------------------------------------------

// y = w * x, one weight, no bias.
struct ScalarImpl : torch::nn::Module {
  ScalarImpl() : w(register_parameter("w", at::ones({1, 1}))) {}
  at::Tensor forward(const at::Tensor& x) { return at::mm(x, w); }
  at::Tensor w;
};
TORCH_MODULE(Scalar);

at::Tensor scalar_input(int rank) { return at::full({1, 1}, static_cast<float>(rank + 1)); }

class SemanticsTest : public ::testing::TestWithParam<int> {};

// ---- A synced forward, then one under no_sync, then one backward of both -----------------

TEST_P(SemanticsTest, NoSyncForwardAfterASyncedOneIsReducedWithIt) {
  const int world = GetParam();
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    Scalar model;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    for (int step = 0; step < 2; ++step) {  // before and after the bucket rebuild
      model->w.mutable_grad() = at::Tensor();
      auto y1 = dmodel(scalar_input(pg.rank()));
      at::Tensor y2;
      {
        auto guard = dmodel->no_sync();
        y2 = dmodel(scalar_input(pg.rank()));
      }
      (y1 + y2).sum().backward();
      // Rank r's local gradient is 2 (r + 1); the average over ranks is world + 1.
      ASSERT_TRUE(model->w.grad().defined());
      EXPECT_FLOAT_EQ(model->w.grad().item<float>(), static_cast<float>(world + 1))
          << "step " << step;
    }
  });
}

TEST_P(SemanticsTest, NoSyncAloneStaysLocalAndTheNextSyncedBackwardReducesTheSum) {
  const int world = GetParam();
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    Scalar model;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    {
      auto guard = dmodel->no_sync();
      dmodel(scalar_input(pg.rank())).sum().backward();
    }
    EXPECT_FLOAT_EQ(model->w.grad().item<float>(), static_cast<float>(pg.rank() + 1));
    dmodel(scalar_input(pg.rank())).sum().backward();
    EXPECT_FLOAT_EQ(model->w.grad().item<float>(), static_cast<float>(world + 1));
  });
}

// ---- Parameters changed after wrapping ----------------------------------------------------

TEST_P(SemanticsTest, ConvertingTheModelAfterWrappingIsAnErrorAtTheNextForward) {
  const int world = GetParam();
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    Scalar model;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    dmodel(scalar_input(pg.rank())).sum().backward();
    dmodel->to(at::kDouble);
    const std::string msg =
        error_of([&] { dmodel(scalar_input(pg.rank()).to(at::kDouble)).sum().backward(); });
    EXPECT_ERROR_HAS(msg, rank_tag(pg.rank(), world));
    EXPECT_ERROR_HAS(msg, "parameter 'w' changed after DDP was constructed");
    EXPECT_ERROR_HAS(msg, "Float");
    EXPECT_ERROR_HAS(msg, "Double");
    EXPECT_ERROR_HAS(msg, "wrap it");
  });
}

TEST_P(SemanticsTest, ConvertingTheWrappedModuleDirectlyIsCaughtToo) {
  run_thread_groups(GetParam(), [&](ddp::ProcessGroup& pg) {
    Scalar model;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    model->to(at::kDouble);
    const std::string msg = error_of([&] { dmodel(scalar_input(0).to(at::kDouble)); });
    EXPECT_ERROR_HAS(msg, "parameter 'w' changed after DDP was constructed");
  });
}

// ---- Reentrant backward -----------------------------------------------------------------

// Activation checkpointing as PyTorch's reentrant checkpoint does it: forward runs the
// block without a graph; backward recomputes it with one and calls backward on it.
struct Checkpoint : torch::autograd::Function<Checkpoint> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t block) {
    ctx->saved_data["block"] = block;
    ctx->save_for_backward({x});
    return reinterpret_cast<torch::nn::SequentialImpl*>(block)->forward(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* block = reinterpret_cast<torch::nn::SequentialImpl*>(ctx->saved_data["block"].toInt());
    at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor out;
    {
      at::AutoGradMode enable(true);
      out = block->forward(x);
    }
    torch::autograd::backward({out}, {grads[0]});  // the reentrant backward
    return {x.grad(), at::Tensor()};
  }
};

// fc -> mid (repeated, shared weights) -> head; mid and head checkpointed or not. The
// head is last in forward, so its gradients arrive first, inside a nested backward.
struct CheckpointedNetImpl : torch::nn::Module {
  CheckpointedNetImpl(bool checkpointed, int repeats)
      : fc(register_module("fc", torch::nn::Linear(8, 16))),
        mid(register_module("mid",
                            torch::nn::Sequential(torch::nn::Linear(16, 16), torch::nn::Tanh()))),
        head(register_module("head", torch::nn::Sequential(torch::nn::Linear(16, 4)))),
        checkpointed(checkpointed),
        repeats(repeats) {}
  at::Tensor run(torch::nn::Sequential& block, const at::Tensor& x) {
    if (!checkpointed) return block->forward(x);
    return Checkpoint::apply(x, reinterpret_cast<int64_t>(block.get()));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::relu(fc(x));
    for (int i = 0; i < repeats; ++i) h = run(mid, h);
    return run(head, h);
  }
  torch::nn::Linear fc;
  torch::nn::Sequential mid, head;
  bool checkpointed;
  int repeats;
};
TORCH_MODULE(CheckpointedNet);

void check_checkpointed(int world, int repeats, bool static_graph) {
  const at::Tensor x = ddp_test::randn({world * kPerRank, 8}, 21);
  const at::Tensor y = ddp_test::randn({world * kPerRank, 4}, 22);
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    const auto want = ddp_test::full_batch_grads(CheckpointedNet(false, repeats), 5, x, y);
    CheckpointedNet model(true, repeats);
    ddp_test::init_params(*model, 5);
    auto dmodel = ddp::DistributedDataParallel(
        model, options_for(pg).static_graph(static_graph).bucket_cap_mb(1e-4));
    for (int step = 0; step < 3; ++step) {
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      ddp_test::mse(dmodel(ddp_test::shard(x, r, kPerRank)), ddp_test::shard(y, r, kPerRank))
          .backward();
      ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, kRtol,
                                   "rank " + std::to_string(r) + " step " + std::to_string(step));
    }
    EXPECT_EQ(dmodel->last_iteration_stats().iteration, 3);
  });
}

TEST_P(SemanticsTest, CheckpointedBlocksMatchTheModelWithoutCheckpointing) {
  check_checkpointed(GetParam(), /*repeats=*/1, /*static_graph=*/false);
}

TEST_P(SemanticsTest, CheckpointedBlocksWorkWithStaticGraph) {
  check_checkpointed(GetParam(), /*repeats=*/1, /*static_graph=*/true);
}

TEST_P(SemanticsTest, StaticGraphAllowsAGradientToArriveTwice) {
  // mid runs twice, each time in its own nested backward: its accumulators fire twice.
  check_checkpointed(GetParam(), /*repeats=*/2, /*static_graph=*/true);
}

// ---- Ranks that miss different parameters ----------------------------------------------

TEST_P(SemanticsTest, RanksMissingDifferentParametersFailFastOnEveryRank) {
  const int world = GetParam();
  ddp_test::TempDir dir;
  ddp_test::run_threads(world, [&](int rank) {
    // A long timeout: a rank blocked on a collective its peers never launch would take
    // that long to fail.
    auto pg =
        ddp::ProcessGroup::create(ddp_test::file_init(dir, rank, world, std::chrono::seconds(60)));
    ddp_test::TwoHeads model;
    auto dmodel = ddp::DistributedDataParallel(
        model, ddp::DistributedDataParallelOptions().process_group(pg).bucket_cap_mb(1e-6));
    const at::Tensor x = ddp_test::randn({kPerRank, 8}, rank);
    dmodel(x).sum().backward();  // both heads everywhere; then one bucket per parameter

    model->heads = rank % 2 == 0 ? "a" : "b";
    const auto start = std::chrono::steady_clock::now();
    at::Tensor out = dmodel(x);
    ASSERT_EQ(dmodel->bucket_indices().size(), 6u);
    out.sum().backward();
    const std::string msg = error_of([&] { dmodel(x); });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 10.0) << "rank " << rank << " blocked";
    EXPECT_ERROR_HAS(msg, rank_tag(rank, world));
    EXPECT_ERROR_HAS(msg, "2 of 6 parameters got no gradient");
    const std::string missing = rank % 2 == 0 ? "'head_b." : "'head_a.";
    EXPECT_ERROR_HAS(msg, missing + "weight'");
    EXPECT_ERROR_HAS(msg, missing + "bias'");
    EXPECT_ERROR_HAS(msg, "find_unused_parameters(true)");
    // Every later forward says the same; releasing the group does not wait either.
    EXPECT_ERROR_HAS(error_of([&] { dmodel(x); }), "got no gradient");
    pg->shutdown();
    const double total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(total, 10.0) << "rank " << rank << " blocked in shutdown";
  });
}

TEST_P(SemanticsTest, WithFindUnusedParametersDifferentBranchesAreAveraged) {
  const int world = GetParam();
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    ddp_test::TwoHeads model;
    ddp_test::init_params(*model, 3);
    auto dmodel = ddp::DistributedDataParallel(
        model, options_for(pg).find_unused_parameters(true).bucket_cap_mb(1e-6));
    model->heads = pg.rank() % 2 == 0 ? "a" : "b";
    const at::Tensor x = ddp_test::randn({kPerRank, 8}, 9);  // the same on every rank
    dmodel(x).sum().backward();
    // Reference: each head's gradient, summed over the ranks that use it, / world.
    ddp_test::TwoHeads ref;
    ddp_test::init_params(*ref, 3);
    ref->heads = "a";
    ref(x).sum().backward();
    const int users_a = (world + 1) / 2;
    EXPECT_TRUE(at::allclose(model->head_a->weight.grad(),
                             ref->head_a->weight.grad() * users_a / world, 1e-5, 1e-6));
  });
}

// ---- World size 1 -----------------------------------------------------------------------

TEST(WorldSizeOneSemanticsTest, ACommHookRunsWithItsRounding) {
  run_thread_groups(1, [&](ddp::ProcessGroup& pg) {
    Scalar model;
    std::atomic<int> calls{0};
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    auto fp16 = ddp::comm_hooks::fp16_compress_hook();
    dmodel->register_comm_hook([&](ddp::GradBucket& bucket) {
      ++calls;
      return fp16->run_hook(bucket);
    });
    const at::Tensor x = at::full({1, 1}, 1.0f / 3.0f);  // not representable in fp16
    dmodel(x).sum().backward();
    EXPECT_EQ(calls.load(), 1);
    EXPECT_EQ(model->w.grad().item<float>(), x.to(at::kHalf).to(at::kFloat).item<float>());
    EXPECT_NE(model->w.grad().item<float>(), x.item<float>());
    EXPECT_EQ(dmodel->last_iteration_stats().iteration, 1);
  });
}

TEST(WorldSizeOneSemanticsTest, MisuseIsCaughtAsAtWorldSizeTwo) {
  run_thread_groups(1, [&](ddp::ProcessGroup& pg) {
    {  // a parameter that gets no gradient, without find_unused_parameters
      ddp_test::TwoHeads model;
      auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
      model->heads = "a";
      dmodel(ddp_test::randn({2, 8}, 1)).sum().backward();
      const std::string msg = error_of([&] { dmodel(ddp_test::randn({2, 8}, 1)); });
      EXPECT_ERROR_HAS(msg, "rank 0 of 1");
      EXPECT_ERROR_HAS(msg, "'head_b.weight'");
    }
    {  // a second backward without a forward
      Scalar model;
      auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
      auto loss = dmodel(scalar_input(0)).sum();
      loss.backward({}, /*retain_graph=*/true);
      EXPECT_ERROR_HAS(error_of([&] { loss.backward(); }),
                       "no forward through the DDP wrapper is waiting for its backward");
    }
    {  // a hook registered twice
      Scalar model;
      auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
      dmodel->register_comm_hook(ddp::comm_hooks::allreduce_hook());
      EXPECT_ERROR_HAS(error_of(
                           [&] { dmodel->register_comm_hook(ddp::comm_hooks::allreduce_hook()); }),
                       "already registered");
    }
  });
}

// ---- Lifetimes and failures ---------------------------------------------------------------

TEST_P(SemanticsTest, AWorkOutlivesItsGroupsShutdown) {
  const int world = GetParam();
  ddp_test::TempDir dir;
  std::mutex mu;
  std::condition_variable cv;
  bool launched = false;
  ddp_test::run_threads(world, [&](int rank) {
    auto pg =
        ddp::ProcessGroup::create(ddp_test::file_init(dir, rank, world, std::chrono::seconds(5)));
    pg->barrier();
    if (rank != 0) {
      // Leave once rank 0 has launched an all-reduce that nobody else joins.
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return launched; });
      lock.unlock();
      pg->shutdown();
      return;
    }
    std::vector<at::Tensor> tensors{at::ones({3})};
    ddp::Work work = pg->all_reduce_async(tensors);
    {
      std::lock_guard<std::mutex> lock(mu);
      launched = true;
    }
    cv.notify_all();
    const auto start = std::chrono::steady_clock::now();
    pg->shutdown();  // must not wait for the work left in flight
    pg.reset();      // and the Work holds nothing of the group that dangles
    const std::string msg = error_of([&] { work.wait(); });
    EXPECT_ERROR_HAS(msg, "all_reduce on rank 0 of " + std::to_string(world) + " (gloo");
    EXPECT_TRUE(work.future()->completed());
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              10.0);
  });
}

TEST_P(SemanticsTest, AfterAFailedBucketEveryForwardSaysTheGroupFailed) {
  const int world = GetParam();
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    ddp_test::Mlp model;
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
    dmodel->register_comm_hook([](ddp::GradBucket&) {
      auto future = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
      future->setError(std::make_exception_ptr(std::runtime_error("injected link failure")));
      return future;
    });
    const at::Tensor x = ddp_test::randn({2, 8}, 1);
    const std::string first = error_of([&] { dmodel(x).sum().backward(); });
    EXPECT_ERROR_HAS(first, "injected link failure");
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::string later;
      try {
        dmodel(x);
        later = "<no exception>";
      } catch (const ddp::ProcessGroupError& e) {
        later = e.what();
      }
      EXPECT_ERROR_HAS(later, rank_tag(pg.rank(), world));
      EXPECT_ERROR_HAS(later, "an earlier gradient reduction of this model failed");
      EXPECT_ERROR_HAS(later, "injected link failure");
      EXPECT_ERROR_HAS(later, "create a new one");
      EXPECT_EQ(later.find("were still waiting"), std::string::npos) << later;
    }
  });
}

// ---- Parameter layouts ----------------------------------------------------------------------

// A conv net whose 4-d weights are channels_last, and a linear layer whose weight is
// stored transposed (dense, not contiguous).
struct LayoutNetImpl : torch::nn::Module {
  LayoutNetImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)))),
        wt(register_parameter("wt", at::zeros({4 * 6 * 6, 5}))) {}
  at::Tensor forward(const at::Tensor& x) { return at::mm(at::relu(conv(x)).flatten(1), wt); }
  void relayout() {
    at::NoGradGuard no_grad;
    conv->weight.set_data(conv->weight.contiguous(at::MemoryFormat::ChannelsLast));
    wt.set_data(wt.t().contiguous().t());
  }
  torch::nn::Conv2d conv;
  at::Tensor wt;
};
TORCH_MODULE(LayoutNet);

void check_layouts(int world, bool as_bucket_view) {
  const at::Tensor x =
      ddp_test::randn({world * 2, 3, 8, 8}, 31).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor y = ddp_test::randn({world * 2, 5}, 32);
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    const auto want = ddp_test::full_batch_grads(LayoutNet(), 8, x, y);
    LayoutNet model;
    ddp_test::init_params(*model, 8);
    model->relayout();
    ASSERT_FALSE(model->conv->weight.is_contiguous());
    ASSERT_FALSE(model->wt.is_contiguous());
    auto dmodel = ddp::DistributedDataParallel(
        model, options_for(pg).gradient_as_bucket_view(as_bucket_view).bucket_cap_mb(1e-4));
    for (int step = 0; step < 2; ++step) {
      if (!as_bucket_view) {
        for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      } else {
        for (auto& p : model->parameters()) {
          if (p.grad().defined()) p.mutable_grad().zero_();
        }
      }
      ddp_test::mse(dmodel(ddp_test::shard(x, r, 2)), ddp_test::shard(y, r, 2)).backward();
      ddp_test::expect_grads_close(ddp_test::current_grads(*model), want, kRtol,
                                   "step " + std::to_string(step));
      // Gradients keep their parameters' layout (as PyTorch's bucket views do).
      for (auto& p : model->parameters()) {
        EXPECT_EQ(p.grad().strides(), p.strides()) << "step " << step;
      }
    }
  });
}

TEST_P(SemanticsTest, ChannelsLastAndTransposedParametersAreReduced) {
  check_layouts(GetParam(), /*as_bucket_view=*/false);
}

TEST_P(SemanticsTest, ChannelsLastGradientsAsBucketViewsKeepTheirLayout) {
  check_layouts(GetParam(), /*as_bucket_view=*/true);
}

struct SparseEmbeddingImpl : torch::nn::Module {
  SparseEmbeddingImpl()
      : emb(register_module("emb", torch::nn::Embedding(
                                       torch::nn::EmbeddingOptions(10, 4).sparse(true)))) {}
  at::Tensor forward(const at::Tensor& i) { return emb(i); }
  torch::nn::Embedding emb;
};
TORCH_MODULE(SparseEmbedding);

TEST_P(SemanticsTest, SparseEmbeddingsAreRefusedAtConstruction) {
  const int world = GetParam();
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    SparseEmbedding model;
    const std::string msg = error_of([&] {
      auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
      (void)dmodel;
    });
    EXPECT_ERROR_HAS(msg, rank_tag(pg.rank(), world));
    EXPECT_ERROR_HAS(msg, "parameter 'emb.weight'");
    EXPECT_ERROR_HAS(msg, "sparse=true");
    EXPECT_ERROR_HAS(msg, "sparse(false)");
  });
}

// ---- Undefined gradients and non-leaf parameters ------------------------------------------------

// x * w whose backward gives w no gradient (an undefined tensor) when `drop` is set:
// w's accumulator still runs, and its hook fires with nothing accumulated.
struct DropWeightGrad : torch::autograd::Function<DropWeightGrad> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, bool drop) {
    ctx->saved_data["drop"] = drop;
    ctx->save_for_backward({x, w});
    return x * w;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool drop = ctx->saved_data["drop"].toBool();
    at::Tensor gw = drop ? at::Tensor() : (grads[0] * saved[0]).sum(0);
    return {grads[0] * saved[1], gw, at::Tensor()};
  }
};

struct GatedImpl : torch::nn::Module {
  GatedImpl()
      : fc(register_module("fc", torch::nn::Linear(8, 4))),
        w(register_parameter("w", at::ones({4}))) {}
  at::Tensor forward(const at::Tensor& x) { return DropWeightGrad::apply(fc(x), w, drop); }
  torch::nn::Linear fc;
  at::Tensor w;
  bool drop = false;
};
TORCH_MODULE(Gated);

TEST_P(SemanticsTest, AHookWithAnUndefinedGradientCountsAsUnused) {
  const int world = GetParam();
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    Gated model;
    ddp_test::init_params(*model, 4);
    auto dmodel = ddp::DistributedDataParallel(model, options_for(pg).find_unused_parameters(true));
    const at::Tensor x = ddp_test::randn({kPerRank, 8}, 12);  // the same on every rank

    // No rank has a gradient for w: it stays undefined, as if unused everywhere.
    model->drop = true;
    dmodel(x).sum().backward();
    EXPECT_FALSE(model->w.grad().defined()) << "rank " << pg.rank();
    EXPECT_TRUE(model->fc->weight.grad().defined());

    // Only rank 0 has one: every rank gets it divided by the world size.
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    model->drop = pg.rank() != 0;
    dmodel(x).sum().backward();
    Gated ref;
    ddp_test::init_params(*ref, 4);
    ref(x).sum().backward();
    ASSERT_TRUE(model->w.grad().defined());
    EXPECT_TRUE(at::allclose(model->w.grad(), ref->w.grad() / world, 1e-5, 1e-6));
  });
}

struct NonLeafImpl : torch::nn::Module {
  NonLeafImpl() : fc(register_module("fc", torch::nn::Linear(4, 4))) {
    // register_parameter keeps leaves only; a module can still hold a computed tensor
    // among its parameters.
    register_parameter("scale", at::ones({4}));
    base = at::ones({4}).requires_grad_();
    parameters_["scale"] = base * 2;
    scale = parameters_["scale"];
  }
  at::Tensor forward(const at::Tensor& x) { return fc(x) * scale; }
  torch::nn::Linear fc;
  at::Tensor base, scale;
};
TORCH_MODULE(NonLeaf);

TEST_P(SemanticsTest, ANonLeafParameterIsRefusedAtConstruction) {
  const int world = GetParam();
  run_thread_groups(world, [&](ddp::ProcessGroup& pg) {
    NonLeaf model;
    ASSERT_FALSE(model->scale.is_leaf());
    const std::string msg = error_of([&] {
      auto dmodel = ddp::DistributedDataParallel(model, options_for(pg));
      (void)dmodel;
    });
    EXPECT_ERROR_HAS(msg, rank_tag(pg.rank(), world));
    EXPECT_ERROR_HAS(msg, "parameter 'scale' is not a leaf tensor");
    EXPECT_ERROR_HAS(msg, "MulBackward");
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, SemanticsTest, ::testing::Values(2, 3),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace

}  // namespace ddp_semantics_test
