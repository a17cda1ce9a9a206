// DDP on groups made by new_subgroups: two pairs train apart (gradients averaged within
// each pair only), while a third group across the pairs runs its own all-reduces between
// the steps. The gradients equal the closed form of each pair's mean.

#include "parallel/ddp_test_util.h"

#include <ddp/distributed/groups.h>

namespace ddp_subgroup_test {

TEST(DdpSubgroups, EachPairAveragesOnlyItsOwnGradients) {
  ddp_test::run_thread_groups(4, [](ddp::ProcessGroup& pg) {
    auto world = ddp_test::borrow(pg);
    const int me = pg.rank();
    auto [pair, pairs] = ddp::new_subgroups(2, ddp::GroupOptions(), world);
    auto [stripe, stripes] =
        ddp::new_subgroups_by_enumeration({{0, 2}, {1, 3}}, ddp::GroupOptions(), world);
    auto linear = torch::nn::Linear(torch::nn::LinearOptions(4, 1).bias(false));
    {
      at::NoGradGuard no_grad;
      linear->weight.fill_(0.5);
    }
    auto model =
        ddp::DistributedDataParallel(linear,
                                     ddp::DistributedDataParallelOptions().process_group(pair));
    for (int step = 0; step < 3; ++step) {
      // Rank r's batch: 2 rows of (r + 1 + step); d(sum of outputs)/dw = column sums.
      at::Tensor x = at::full({2, 4}, static_cast<float>(me + 1 + step));
      linear->zero_grad();
      model(x).sum().backward();
      const int mate = me ^ 1;
      const float want = (2.0f * (me + 1 + step) + 2.0f * (mate + 1 + step)) / 2.0f;
      EXPECT_TRUE(at::allclose(linear->weight.grad(), at::full({1, 4}, want)))
          << "rank " << me << " step " << step << ": " << linear->weight.grad();
      at::Tensor t = at::full({1}, static_cast<float>(me));
      stripe->all_reduce(t);
      EXPECT_EQ(t.item<float>(), static_cast<float>(me % 2 + me % 2 + 2));
    }
  });
}

}  // namespace ddp_subgroup_test
