// HSDP: fully_shard on a 2 x 2 mesh (replicate, shard) against one process training the
// same MLP on all four ranks' batches with Adam. Also gradient accumulation with
// set_requires_all_reduce(false): the shard groups' sums wait, and the last backward
// all-reduces them. And a scenario for two hosts (tests/ddprun/test_two_hosts.py).

#include "parallel/ddp_test_util.h"

#include <ddp/distributed/default_group.h>
#include <ddp/distributed/device_mesh.h>
#include <ddp/fsdp/fully_shard.h>

#include <torch/nn/modules/container/functional.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

namespace fully_shard_hsdp_test {

namespace {

std::shared_ptr<torch::nn::SequentialImpl> make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(7, 13), torch::nn::Functional(at::tanh),
                               torch::nn::Linear(13, 5))
      .ptr();
}

// Rank r's rows of microbatch `m` at step `s`.
at::Tensor batch(int s, int m, int r) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * s + 10 * m + r);
  return at::randn({3, 7}, gen);
}

constexpr int kWorld = 4, kSteps = 4;

// The reference: one process, all ranks' rows; each microbatch's loss is the mean over
// all of them, as the average of the ranks' means is.
std::shared_ptr<torch::nn::SequentialImpl> reference(int accum) {
  auto ref = make_mlp();
  ddp_test::init_params(*ref, 5);
  torch::optim::Adam ref_opt(ref->parameters(), torch::optim::AdamOptions(1e-2));
  for (int s = 0; s < kSteps; ++s) {
    ref_opt.zero_grad();
    for (int m = 0; m < accum; ++m) {
      std::vector<at::Tensor> rows;
      for (int r = 0; r < kWorld; ++r) rows.push_back(batch(s, m, r));
      ref->forward(at::cat(rows)).pow(2).mean().backward();
    }
    ref_opt.step();
  }
  return ref;
}

// HSDP on `mesh` (replicate, shard) as global rank `rank`, `accum` microbatches per step
// with the all-reduce on the last only. Returns "" when the full parameters equal the
// reference's (or this rank holds none: shard rank 0 of each replica does), else what
// differs.
std::string train_and_compare(const ddp::DeviceMesh& mesh, int rank, int accum,
                              const torch::nn::Module& ref) {
  auto model = make_mlp();
  ddp_test::init_params(*model, 5);
  auto fsdp = ddp::fully_shard(model, ddp::FullyShardOptions().mesh(mesh));
  torch::optim::Adam opt(fsdp->parameters(), torch::optim::AdamOptions(1e-2));
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    for (int m = 0; m < accum; ++m) {
      fsdp->set_requires_all_reduce(m == accum - 1);
      fsdp->forward(batch(s, m, rank)).pow(2).mean().backward();
    }
    opt.step();
  }
  const auto state = ddp::full_state_dict(*fsdp);
  if (state.empty()) return "";
  std::string diffs;
  for (const auto& item : ref.named_parameters()) {
    if (!state.contains(item.key())) {
      diffs += item.key() + " missing; ";
      continue;
    }
    const at::Tensor got = state.at(item.key());
    if (!at::allclose(got, item.value(), 1e-5, 1e-5)) {
      diffs += c10::str(item.key(), " differs by ", (got - item.value()).abs().max().item<double>(),
                        "; ");
    }
  }
  return diffs;
}

void train(int accum, const std::string& what) {
  auto ref = reference(accum);
  ddp_test::run_thread_groups(kWorld, [&](ddp::ProcessGroup& pg) {
    ddp::DeviceMesh mesh("cpu", at::arange(kWorld, at::kLong).view({2, 2}), {"replicate", "shard"},
                         ddp_test::borrow(pg));
    EXPECT_EQ(train_and_compare(mesh, pg.rank(), accum, *ref), "")
        << what << ", rank " << pg.rank();
  });
}

}  // namespace

TEST(FullyShardHsdp, TwoByTwoMeshMatchesOneProcess) { train(1, "hsdp"); }

TEST(FullyShardHsdp, AccumulationWithoutAllReduceMatchesOneProcess) {
  train(3, "hsdp, 3 microbatches");
}

// Note [The replicas' all-reduce overlaps]: the last layer's all-reduce across replicas
// is launched before the first layer's reduce-scatter and finishes after it started.
TEST(FullyShardHsdp, AllReduceOverlapsTheNextReduceScatter) {
  std::mutex mu;
  std::map<std::thread::id, std::vector<std::string>> events;
  ddp::set_fully_shard_observer([&](ddp::FullyShardEvent e, const std::string& unit) {
    std::lock_guard<std::mutex> lock(mu);
    events[std::this_thread::get_id()].push_back(std::string(ddp::to_string(e)) + " " + unit);
  });
  // Unset however the test ends: the observer refers to this frame.
  struct Unset {
    ~Unset() { ddp::set_fully_shard_observer(nullptr); }
  } unset;
  ddp_test::run_thread_groups(4, [](ddp::ProcessGroup& pg) {
    ddp::DeviceMesh mesh("cpu", at::arange(4, at::kLong).view({2, 2}), {"replicate", "shard"},
                         ddp_test::borrow(pg));
    auto model = make_mlp();
    ddp_test::init_params(*model, 5);
    const auto opts = ddp::FullyShardOptions().mesh(mesh);
    ddp::fully_shard(model->ptr<torch::nn::LinearImpl>(0), opts);
    ddp::fully_shard(model->ptr<torch::nn::LinearImpl>(2), opts);
    auto fsdp = ddp::fully_shard(model, opts);
    fsdp->forward(batch(0, 0, pg.rank())).pow(2).mean().backward();
  });
  ASSERT_EQ(events.size(), 4u);
  for (const auto& item : events) {
    const auto& ev = item.second;
    auto at = [&](const std::string& what) {
      return std::find(ev.begin(), ev.end(), what) - ev.begin();
    };
    const auto n = static_cast<std::ptrdiff_t>(ev.size());
    std::string all;
    for (const auto& e : ev) all += e + "; ";
    ASSERT_LT(at("all_reduce_started 2"), n) << all;
    EXPECT_LT(at("all_reduce_started 2"), at("reduce_scatter_started 0")) << all;
    EXPECT_LT(at("reduce_scatter_started 0"), at("reduce_scatter_finished 2")) << all;
    EXPECT_LT(at("reduce_scatter_finished 2"), n) << all;
  }
}

TEST(FullyShardHsdp, ReplicasMustStartEqual) {
  ddp_test::run_thread_groups(4, [](ddp::ProcessGroup& pg) {
    ddp::DeviceMesh mesh("cpu", at::arange(4, at::kLong).view({2, 2}), {"replicate", "shard"},
                         ddp_test::borrow(pg));
    auto model = make_mlp();
    ddp_test::init_params(*model, pg.rank() < 2 ? 5 : 6);  // the replicas differ
    const std::string msg =
        ddp_test::error_of([&] { ddp::fully_shard(model, ddp::FullyShardOptions().mesh(mesh)); });
    EXPECT_NE(msg.find("differ between replica 0 and replica 1"), std::string::npos) << msg;
  });
}

// Started by tests/ddprun/test_two_hosts.py: 4 ranks on two hosts (network namespaces
// with a /dev/shm each), two per host. init_device_mesh's rows are the hosts, so the
// shard groups get shared memory and the replicate groups Gloo, under the default choice.
DDP_SCENARIO(hsdp_hosts) {
  const char* method = std::getenv("DDP_TEST_INIT_METHOD");
  if (method == nullptr) return 2;
  ddp::ProcessGroupGuard guard(
      ddp::InitOptions().init_method(method).timeout(std::chrono::seconds(60)));
  const int rank = ddp::get_rank();
  if (ddp::get_world_size() != kWorld || ddp::get_local_world_size() != 2) return 3;
  const ddp::DeviceMesh mesh = ddp::init_device_mesh("cpu", {2, 2}, {"replicate", "shard"});
  const std::string shard = mesh.get_group("shard")->backend();
  const std::string replicate = mesh.get_group("replicate")->backend();
  std::printf("rank %d: shard group %s, replicate group %s\n", rank, shard.c_str(),
              replicate.c_str());
  if (shard != "shm" || replicate != "gloo") return 4;
  const std::string diffs = train_and_compare(mesh, rank, 2, *reference(2));
  if (!diffs.empty()) {
    std::printf("rank %d: HSDP differs from one process: %s\n", rank, diffs.c_str());
    return 5;
  }
  std::printf("rank %d: HSDP across hosts equals one process\n", rank);
  return 0;
}

}  // namespace fully_shard_hsdp_test
