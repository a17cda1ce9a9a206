// reduce_scatter_tensor and all_gather_into_tensor against closed forms, through the
// backend's own collective where it has one and through the fallbacks of
// Note [Flat collective fallbacks] (a Comm that offers only the basic collectives).

#include "support/harness.h"

#include "distributed/comm.h"
#include "distributed/rendezvous/rendezvous.h"
#include "distributed/work.h"

#include <ddp/distributed/process_group.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <tuple>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace flat_collectives_test {

namespace {

// A real group whose flat collectives are the base class's fallbacks.
class BasicComm final : public ddp::detail::Comm {
 public:
  explicit BasicComm(std::unique_ptr<Comm> inner)
      : Comm(inner->config()), inner_(std::move(inner)) {}
  std::shared_ptr<ddp::detail::PendingWork> all_reduce(std::vector<at::Tensor>& tensors,
                                                       ddp::ReduceOp op) override {
    return inner_->all_reduce(tensors, op);
  }
  std::shared_ptr<ddp::detail::PendingWork> broadcast(std::vector<at::Tensor>& tensors,
                                                      int src) override {
    return inner_->broadcast(tensors, src);
  }
  std::shared_ptr<ddp::detail::PendingWork> all_gather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs) override {
    return inner_->all_gather(outputs, inputs);
  }
  void barrier() override { inner_->barrier(); }
  void shutdown() override { inner_->shutdown(); }

 private:
  std::unique_ptr<Comm> inner_;
};

void run_groups(int world, bool fallback, const std::function<void(ddp::ProcessGroup&)>& fn) {
  ddp_test::TempDir dir;
  ddp_test::run_threads(world, [&](int rank) {
    auto comm = ddp::detail::Comm::create(
        ddp::detail::resolve_rendezvous(ddp_test::file_init(dir, rank, world)));
    if (fallback) comm = std::make_unique<BasicComm>(std::move(comm));
    auto pg = ddp::detail::make_process_group(std::move(comm));
    pg->barrier();  // as run_thread_groups: nobody releases a group a peer still joins
    fn(*pg);
  });
}

}  // namespace

class FlatCollectivesTest : public ::testing::TestWithParam<std::tuple<int, int64_t, bool>> {};

// Rank r's input chunk c holds 100 * r + 10 * c + i; the sum of chunk c over ranks is
// 100 * W(W-1)/2 + W * (10 * c + i).
TEST_P(FlatCollectivesTest, ReduceScatterMatchesTheClosedForm) {
  const auto [world, n, fallback] = GetParam();
  run_groups(world, fallback, [&, n = n](ddp::ProcessGroup& pg) {
    const int w = pg.size();
    const int r = pg.rank();
    const at::Tensor i = at::arange(n, at::kFloat);
    std::vector<at::Tensor> chunks;
    for (int c = 0; c < w; ++c) chunks.push_back(i + 100.0 * r + 10.0 * c);
    const at::Tensor input = at::cat(chunks);
    const at::Tensor before = input.clone();
    const at::Tensor want = i * w + 100.0 * w * (w - 1) / 2 + 10.0 * w * r;

    at::Tensor out = at::full({n}, -1.0f);
    pg.reduce_scatter_tensor(out, input);
    EXPECT_TRUE(at::equal(out, want)) << out << "\nwant " << want;
    EXPECT_TRUE(at::equal(input, before)) << "the input changed";

    pg.reduce_scatter_tensor(out, input, ddp::ReduceOp::AVG);
    EXPECT_TRUE(at::allclose(out, want / w));
    pg.reduce_scatter_tensor(out, input, ddp::ReduceOp::MAX);
    EXPECT_TRUE(at::equal(out, i + 100.0 * (w - 1) + 10.0 * r));

    // Launched, then read through the future, as a DDP comm hook would.
    at::Tensor async_input = input.clone();
    at::Tensor async_out = at::zeros({n});
    auto work = pg.reduce_scatter_tensor_async(async_out, async_input, ddp::ReduceOp::AVG);
    auto future = work.future();
    future->wait();
    EXPECT_TRUE(at::allclose(future->value().toTensorVector().at(0), want / w));
    work.wait();
    EXPECT_TRUE(at::allclose(async_out, want / w));
  });
}

TEST_P(FlatCollectivesTest, AllGatherIntoTensorMatchesTheClosedForm) {
  const auto [world, n, fallback] = GetParam();
  run_groups(world, fallback, [&, n = n](ddp::ProcessGroup& pg) {
    const int w = pg.size();
    const at::Tensor input = at::arange(n, at::kDouble) + 1000.0 * pg.rank();
    at::Tensor out = at::full({w * n}, -1.0, at::kDouble);
    pg.all_gather_into_tensor(out, input);
    std::vector<at::Tensor> rows;
    for (int r = 0; r < w; ++r) rows.push_back(at::arange(n, at::kDouble) + 1000.0 * r);
    EXPECT_TRUE(at::equal(out, at::cat(rows)));

    at::Tensor again = at::zeros({w * n}, at::kDouble);
    at::Tensor in = input.clone();
    auto work = pg.all_gather_into_tensor_async(again, in);
    work.wait();
    EXPECT_TRUE(at::equal(again, at::cat(rows)));
  });
}

TEST_P(FlatCollectivesTest, WrongSizesAreNamed) {
  const auto [world, n, fallback] = GetParam();
  if (n == 0) return;  // the sizes below are wrong only for n > 0
  run_groups(world, fallback, [&, n = n](ddp::ProcessGroup& pg) {
    at::Tensor out = at::zeros({n});
    const at::Tensor input = at::zeros({n * pg.size() + 1});
    EXPECT_NE(ddp_test::error_of([&] { pg.reduce_scatter_tensor(out, input); })
                  .find("the flat tensor has " + std::to_string(n * pg.size() + 1) +
                        " elements, but world_size (" + std::to_string(pg.size()) + ")"),
              std::string::npos);
    at::Tensor wrong_dtype = at::zeros({n * pg.size()}, at::kDouble);
    EXPECT_NE(ddp_test::error_of([&] {
                pg.all_gather_into_tensor(wrong_dtype, out);
              }).find("the flat tensor is Double but the chunk is Float"),
              std::string::npos);
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, FlatCollectivesTest,
                         ::testing::Combine(::testing::Values(1, 2, 3),
                                            ::testing::Values<int64_t>(0, 5), ::testing::Bool()),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_numel" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_fallback" : "_native");
                         });

// Note [After runs once]: a work's follow-up copy runs once, whether wait() or a
// callback on future() (as the flight recorder attaches) gets there first, and wait()
// returns only after it. It used to run twice: a late second copy, from the callback on
// the backend's thread, overwrote what the caller had written into the output since.
TEST(ThenWorkTest, AfterRunsOnceWhicheverPathComesFirst) {
  for (bool callback_first : {true, false}) {
    auto future = ddp::detail::tensor_list_future();
    auto inner = ddp::detail::future_work(future);
    std::atomic<int> runs{0};
    at::Tensor out = at::zeros({4});
    auto work = ddp::detail::then_work(inner,
                                       [&] {
                                         runs++;
                                         out.fill_(7);
                                       },
                                       {out});
    auto chained = work->future();  // what the flight recorder does
    if (callback_first) {
      future->markCompleted(c10::IValue(std::vector<at::Tensor>{out}));
      work->wait();
    } else {
      std::thread completer(
          [&] { future->markCompleted(c10::IValue(std::vector<at::Tensor>{out})); });
      work->wait();
      completer.join();
    }
    EXPECT_EQ(out[0].item<float>(), 7.0f);
    out.zero_();  // the caller's own write after wait()
    chained->wait();
    EXPECT_EQ(runs.load(), 1) << "callback first: " << callback_first;
    EXPECT_EQ(out[0].item<float>(), 0.0f) << "a second copy overwrote the caller's write";
  }
}

}  // namespace flat_collectives_test
