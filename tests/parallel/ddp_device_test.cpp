// The GPU path checked on a CPU. The device stand-in (Note [Device stand-in]) makes a
// second device whose tensors are not CPU tensors to LibTorch, and the "standin"
// backend holds them to NCCL's rule (this rank's device only): a host tensor in a
// collective must fail, naming the call, and DDP on the stand-in must give the bits of
// DDP on the CPU. A real one-rank group (InitOptions::single_rank_group) must send DDP's
// buckets through its backend, where the world-size-1 shortcut sends nothing.

#include "parallel/ddp_test_util.h"
#include "support/util.h"

#include "distributed/comm.h"
#include "distributed/backends/device_standin.h"
#include "distributed/rendezvous/rendezvous.h"
#include "parallel/bucket.h"

#include <torch/optim/sgd.h>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace ddp_device_test {

using ddp_test::error_of;

namespace {

std::shared_ptr<ddp::ProcessGroup> standin_group(const ddp_test::TempDir& dir, int rank,
                                                 int world) {
  ddp::detail::CommConfig c =
      ddp::detail::resolve_rendezvous(ddp_test::file_init(dir, rank, world));
  c.backend = "standin";
  c.backend_auto = false;
  c.single_rank_group = world == 1;  // so that DDP sends its buckets at world size 1 too
  return ddp::detail::make_process_group(ddp::detail::Comm::create(c));
}

class DeviceStandinTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!ddp::detail::standin_supported()) {
      // LibTorch 1.13: the stand-in is not built, and says so.
      EXPECT_ERROR_HAS(error_of([] { ddp::detail::enable_standin_device(); }),
                       "needs LibTorch 2.1 or newer");
      GTEST_SKIP() << "the device stand-in needs LibTorch 2.1 or newer";
    }
    ddp::detail::enable_standin_device();
  }
};

TEST_P(DeviceStandinTest, CollectivesTakeOnlyThisRanksDeviceAndSumExactly) {
  const int world = GetParam();
  ddp_test::TempDir dir;
  ddp_test::run_threads(world, [&](int rank) {
    auto pg = standin_group(dir, rank, world);
    const c10::Device device = pg->device();
    EXPECT_EQ(device.type(), c10::DeviceType::PrivateUse1);
    EXPECT_EQ(device.index(), rank);
    EXPECT_EQ(pg->backend(), "standin");

    at::Tensor t = at::full({5}, rank + 1.0, at::TensorOptions().device(device));
    pg->all_reduce(t, ddp::ReduceOp::SUM);
    EXPECT_EQ(t.device(), device);
    EXPECT_TRUE(at::equal(t.cpu(), at::full({5}, world * (world + 1) / 2.0)));

    const std::vector<at::Tensor> rows = pg->all_gather(at::full({2}, rank, t.options()));
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(rows[r].device(), device);
      EXPECT_TRUE(at::equal(rows[r].cpu(), at::full({2}, r, at::kFloat)));
    }
    at::Tensor whole = at::arange(2 * world, t.options()) + rank;
    at::Tensor part = at::empty({2}, t.options());
    pg->reduce_scatter_tensor(part, whole, ddp::ReduceOp::SUM);
    const double base = world * (world - 1) / 2.0;
    EXPECT_TRUE(
        at::equal(part.cpu(), at::arange(2 * rank, 2 * rank + 2, at::kFloat) * world + base));

    // A tensor made on the host reaches the collective: the error names the call, the
    // tensor's device and this rank's, before anything is sent.
    at::Tensor host = at::ones({3});
    const std::string error = error_of([&] { pg->all_reduce(host); });
    EXPECT_ERROR_HAS(error, "all_reduce on rank " + std::to_string(rank));
    EXPECT_ERROR_HAS(error, "is on cpu");
    EXPECT_ERROR_HAS(error, device.str());
    EXPECT_ERROR_HAS(error, "made on the host must be moved first");
    // So is another rank's device (NCCL reads only this rank's GPU).
    at::Tensor other =
        at::ones({3}, at::TensorOptions().device(ddp::detail::standin_device(world)));
    EXPECT_ERROR_HAS(error_of([&] { pg->broadcast(other, 0); }), "broadcast on rank");
    pg->barrier();
  });
}

// The ranks' batches differ; every rank ends with the same parameters, and the very bits
// that DDP on CPU tensors over Gloo gives.
TEST_P(DeviceStandinTest, DdpOnTheStandinGivesTheBitsOfDdpOnTheCpu) {
  const int world = GetParam();
  const at::Tensor x = ddp_test::randn({world * 4, 8}, 11);
  const at::Tensor y = ddp_test::randn({world * 4, 4}, 12);
  std::vector<std::vector<at::Tensor>> result[2];  // [standin, cpu][rank]
  result[0].resize(world);
  result[1].resize(world);
  for (int run = 0; run < 2; ++run) {
    ddp_test::TempDir dir;
    ddp_test::run_threads(world, [&](int rank) {
      std::shared_ptr<ddp::ProcessGroup> pg =
          run == 0 ? standin_group(dir, rank, world)
                   : ddp::ProcessGroup::create(ddp_test::file_init(dir, rank, world)
                                                   .backend("gloo")
                                                   .single_rank_group(world == 1));
      const c10::Device device = run == 0 ? pg->device() : c10::Device(c10::DeviceType::CPU);
      ddp_test::Mlp model;
      ddp_test::init_params(*model, 5);
      model->to(device);
      auto dmodel = ddp::DistributedDataParallel(
          model, ddp::DistributedDataParallelOptions().process_group(pg).bucket_cap_mb(0.0005));
      torch::optim::SGD sgd(dmodel->parameters(), 0.1);
      for (int step = 0; step < 3; ++step) {
        sgd.zero_grad();
        const at::Tensor xs = x.narrow(0, 4 * rank, 4).to(device);
        const at::Tensor ys = y.narrow(0, 4 * rank, 4).to(device);
        torch::nn::functional::mse_loss(dmodel(xs), ys).backward();
        sgd.step();
      }
      const ddp::IterationStats stats = dmodel->last_iteration_stats();
      EXPECT_EQ(stats.iteration, 3);
      EXPECT_GT(stats.num_buckets, 1u);
      // Note [Device time]: on the stand-in every bucket is timed by its events.
      ASSERT_EQ(stats.bucket_allreduce_ms.size(), stats.num_buckets);
      for (double ms : stats.bucket_allreduce_ms) EXPECT_GE(ms, 0.0);
      EXPECT_LE(stats.buckets_done_before_end, stats.num_buckets);
      for (const auto& p : model->parameters()) {
        EXPECT_EQ(p.device(), device);
        result[run][rank].push_back(p.detach().cpu());
      }
      pg->barrier();
    });
  }
  for (int rank = 0; rank < world; ++rank) {
    for (size_t i = 0; i < result[0][rank].size(); ++i) {
      EXPECT_TRUE(at::equal(result[0][rank][i], result[1][rank][i]))
          << "rank " << rank << ", parameter " << i;
      EXPECT_TRUE(at::equal(result[0][rank][i], result[0][0][i])) << "rank " << rank;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeviceStandinTest, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

// ---- A real one-rank group ------------------------------------------------------------

TEST(SingleRankGroupTest, DdpReducesThroughTheBackendAtWorldSizeOne) {
  for (const bool real : {false, true}) {
    ddp_test::TempDir dir;
    auto pg = ddp::ProcessGroup::create(ddp_test::file_init(dir, 0, 1).single_rank_group(real));
    EXPECT_EQ(ddp::detail::comm_of(*pg).trivial(), !real);
    ddp_test::Mlp model, plain;
    ddp_test::init_params(*model, 3);
    ddp_test::init_params(*plain, 3);
    auto dmodel = ddp::DistributedDataParallel(
        model, ddp::DistributedDataParallelOptions().process_group(pg).bucket_cap_mb(0.0005));
    const at::Tensor x = ddp_test::randn({6, 8}, 4), y = ddp_test::randn({6, 4}, 5);
    for (int step = 0; step < 2; ++step) {
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      for (auto& p : plain->parameters()) p.mutable_grad() = at::Tensor();
      torch::nn::functional::mse_loss(dmodel(x), y).backward();
      torch::nn::functional::mse_loss(plain(x), y).backward();
      for (size_t i = 0; i < model->parameters().size(); ++i) {
        EXPECT_TRUE(at::equal(model->parameters()[i].grad(), plain->parameters()[i].grad()))
            << "parameter " << i << ", single_rank_group " << real;
      }
    }
    const ddp::IterationStats stats = dmodel->last_iteration_stats();
    EXPECT_EQ(stats.iteration, 2);
    EXPECT_GT(stats.num_buckets, 1u);
    // Through the group every bucket is sent and timed; the shortcut sends none.
    EXPECT_EQ(stats.bucket_allreduce_ms.size(), real ? stats.num_buckets : 0u);
    // The other world-size-1 shortcuts follow the group too.
    EXPECT_EQ(pg->all_gather_bytes("abc"), std::vector<std::string>{"abc"});
    pg->monitored_barrier(std::chrono::seconds(10));
  }
}

TEST(SingleRankGroupTest, TheEnvironmentVariableAsksForItToo) {
  ddp_test::TempDir dir;
  ASSERT_EQ(setenv("DDP_SINGLE_RANK_GROUP", "1", 1), 0);
  auto pg = ddp::ProcessGroup::create(ddp_test::file_init(dir, 0, 1));
  EXPECT_FALSE(ddp::detail::comm_of(*pg).trivial());
  ASSERT_EQ(setenv("DDP_SINGLE_RANK_GROUP", "maybe", 1), 0);
  EXPECT_ERROR_HAS(error_of([&] { ddp::ProcessGroup::create(ddp_test::file_init(dir, 0, 1)); }),
                   "DDP_SINGLE_RANK_GROUP must be 1 or 0");
  unsetenv("DDP_SINGLE_RANK_GROUP");
}

}  // namespace

namespace {

// Note [Device time]: on a device a future completes when the collective is queued (NCCL),
// so a bucket is done only when the event its callback recorded is.
TEST(DeviceTimeTest, ADeviceBucketIsDoneByItsEndEventNotByItsFuture) {
  if (!ddp::detail::standin_supported()) GTEST_SKIP() << "no device events in this build";
  ddp::detail::enable_standin_device();
  const c10::Device device = ddp::detail::standin_device(0);
  auto future =
      c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  future->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
  ddp::detail::BucketTiming host, on_device;
  host.launch_ns = 1;
  EXPECT_TRUE(host.finished(*future));  // the host: the future is the truth
  on_device.launch_ns = 1;
  on_device.start = ddp::detail::DeviceEvent::record(device);
  ASSERT_NE(on_device.start, nullptr);
  EXPECT_FALSE(on_device.finished(*future)) << "completed future, but no end event yet";
  on_device.set_end(ddp::detail::DeviceEvent::record(device));
  EXPECT_TRUE(on_device.finished(*future));
  EXPECT_GE(on_device.reduction_ms(), 0.0);
  // The CPU never gets events: its times are the host's.
  EXPECT_EQ(ddp::detail::DeviceEvent::record(c10::Device(c10::DeviceType::CPU)), nullptr);
}

}  // namespace

}  // namespace ddp_device_test
