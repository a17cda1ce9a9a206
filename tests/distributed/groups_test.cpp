// new_group, new_subgroups and new_subgroups_by_enumeration: groups made from the
// parent's store, with no second rendezvous; members reduce among themselves, the others
// get a handle that refuses; overlapping groups used in interleaved order; the rank
// helpers against PyTorch's definitions; shared memory for a group on one host.

#include "support/harness.h"

#include <ddp/distributed/default_group.h>
#include <ddp/distributed/groups.h>
#include <ddp/distributed/process_group.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace groups_test {

namespace {

void run_groups(const std::string& backend, int world,
                const std::function<void(std::shared_ptr<ddp::ProcessGroup>)>& fn) {
  ddp_test::TempDir dir;
  ddp_test::run_threads(world, [&](int rank) {
    auto pg = ddp::ProcessGroup::create(ddp_test::file_init(dir, rank, world).backend(backend));
    pg->barrier();
    fn(pg);
    pg->barrier();
  });
}

float sum_of(const std::vector<int>& ranks) {
  float s = 0;
  for (int r : ranks) s += static_cast<float>(r + 1);
  return s;
}

}  // namespace

class GroupsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GroupsTest, MembersReduceAmongThemselvesAndOthersAreRefused) {
  run_groups(GetParam(), 4, [](std::shared_ptr<ddp::ProcessGroup> world) {
    const int me = world->rank();
    auto odd = ddp::new_group({3, 1}, ddp::GroupOptions(), world);  // group ranks 0 -> 3, 1 -> 1
    EXPECT_EQ(odd->ranks(), (std::vector<int>{3, 1}));
    EXPECT_EQ(ddp::get_process_group_ranks(odd), (std::vector<int>{3, 1}));
    EXPECT_EQ(ddp::get_global_rank(odd, 0), 3);
    EXPECT_EQ(ddp::get_group_rank(odd, 1), 1);
    EXPECT_EQ(odd->size(), 2);
    if (me == 1 || me == 3) {
      EXPECT_TRUE(odd->is_member());
      EXPECT_EQ(odd->rank(), me == 3 ? 0 : 1);
      at::Tensor t = at::full({3}, static_cast<float>(me + 1));
      odd->all_reduce(t);
      EXPECT_TRUE(at::equal(t, at::full({3}, sum_of({1, 3}))));
      // Rooted ops take group ranks.
      at::Tensor b = at::full({2}, static_cast<float>(me));
      odd->broadcast(b, 0);
      EXPECT_TRUE(at::equal(b, at::full({2}, 3.0f)));
    } else {
      EXPECT_FALSE(odd->is_member());
      EXPECT_EQ(odd->rank(), -1);
      at::Tensor t = at::ones({3});
      const std::string msg = ddp_test::error_of([&] { odd->all_reduce(t); });
      EXPECT_NE(msg.find("not a member of this group (global ranks [3, 1])"), std::string::npos)
          << msg;
      EXPECT_NE(ddp_test::error_of([&] { ddp::get_group_rank(odd, me); }).find("not in the group"),
                std::string::npos);
    }
    // The parent still works, and so does a group after the refused call.
    at::Tensor all = at::full({1}, static_cast<float>(me + 1));
    world->all_reduce(all);
    EXPECT_EQ(all.item<float>(), sum_of({0, 1, 2, 3}));
  });
}

TEST_P(GroupsTest, OverlappingGroupsInInterleavedOrder) {
  run_groups(GetParam(), 4, [](std::shared_ptr<ddp::ProcessGroup> world) {
    const int me = world->rank();
    auto low = ddp::new_group({0, 1, 2}, ddp::GroupOptions(), world);
    auto high = ddp::new_group({1, 2, 3}, ddp::GroupOptions(), world);
    for (int step = 0; step < 5; ++step) {
      // Ranks 1 and 2 are in both; each group's own order is the same on its members.
      if (low->is_member()) {
        at::Tensor t = at::full({4}, static_cast<float>(me + 1 + step));
        std::vector<at::Tensor> ts{t};
        ddp::Work w = low->all_reduce_async(ts);
        if (high->is_member()) {
          at::Tensor u = at::full({4}, static_cast<float>(me + 1));
          high->all_reduce(u);
          EXPECT_TRUE(at::equal(u, at::full({4}, sum_of({1, 2, 3}))));
        }
        w.wait();
        EXPECT_TRUE(at::equal(t, at::full({4}, sum_of({0, 1, 2}) + 3.0f * step)));
      } else {
        at::Tensor u = at::full({4}, static_cast<float>(me + 1));
        high->all_reduce(u);
        EXPECT_TRUE(at::equal(u, at::full({4}, sum_of({1, 2, 3}))));
      }
    }
  });
}

TEST_P(GroupsTest, SubgroupsBySizeAndByEnumeration) {
  run_groups(GetParam(), 4, [](std::shared_ptr<ddp::ProcessGroup> world) {
    const int me = world->rank();
    auto [pair, pairs] = ddp::new_subgroups(2, ddp::GroupOptions(), world);
    ASSERT_EQ(pairs.size(), 2u);
    EXPECT_EQ(pair->ranks(), (std::vector<int>{me / 2 * 2, me / 2 * 2 + 1}));
    at::Tensor t = at::full({2}, static_cast<float>(me + 1));
    pair->all_reduce(t);
    EXPECT_EQ(t[0].item<float>(), sum_of(pair->ranks()));

    auto [stripe, stripes] =
        ddp::new_subgroups_by_enumeration({{0, 2}, {1, 3}}, ddp::GroupOptions(), world);
    ASSERT_EQ(stripes.size(), 2u);
    EXPECT_EQ(stripe->ranks(), (std::vector<int>{me % 2, me % 2 + 2}));
    std::vector<at::Tensor> got{at::empty({1}), at::empty({1})};
    stripe->all_gather(got, at::full({1}, static_cast<float>(me)));
    EXPECT_EQ(got[1].item<float>(), static_cast<float>(me % 2 + 2));
    // A group of a group: the pair's first rank alone, by global rank.
    auto first = ddp::new_group({pair->ranks()[0]}, ddp::GroupOptions(), pair);
    EXPECT_EQ(first->is_member(), me % 2 == 0);
    EXPECT_NE(ddp_test::error_of([&] {
                ddp::new_subgroups_by_enumeration({{0, 1}, {1, 2}}, ddp::GroupOptions(), world);
              }).find("rank 1 is in two subgroups"),
              std::string::npos);
    EXPECT_NE(ddp_test::error_of([&] {
                ddp::new_subgroups(3, ddp::GroupOptions(), world);
              }).find("divide the group's size, 4"),
              std::string::npos);
  });
}

// Note [Free functions take global ranks]: ddp::reduce(t, dst, op, group) and the other
// free functions name ranks as torch.distributed's do, by global rank; the group's
// methods take group ranks. Group {3, 1, 2} of 4: global 2 is group rank 2, global 3 is 0.
TEST_P(GroupsTest, FreeFunctionsTakeGlobalRanks) {
  run_groups(GetParam(), 4, [](std::shared_ptr<ddp::ProcessGroup> world) {
    const int me = world->rank();
    auto g = ddp::new_group({3, 1, 2}, ddp::GroupOptions(), world);
    EXPECT_EQ(ddp::get_rank(g), me == 0 ? -1 : (me == 3 ? 0 : me));
    EXPECT_EQ(ddp::get_world_size(g), me == 0 ? -1 : 3);
    if (!g->is_member()) {
      at::Tensor t = at::ones({2});
      const std::string msg = ddp_test::error_of([&] { ddp::reduce(t, 3, ddp::ReduceOp::SUM, g); });
      EXPECT_NE(msg.find("not a member of this group"), std::string::npos) << msg;
      return;
    }
    const float mine = static_cast<float>(me + 1);
    // reduce to global rank 2 (group rank 2) and to global rank 3 (group rank 0).
    for (int dst : {2, 3}) {
      at::Tensor t = at::full({3}, mine);
      ddp::reduce(t, dst, ddp::ReduceOp::SUM, g);
      if (me == dst) EXPECT_TRUE(at::equal(t, at::full({3}, sum_of({3, 1, 2})))) << dst;
    }
    // broadcast from global rank 1 (group rank 1).
    at::Tensor b = at::full({2}, mine);
    ddp::broadcast(b, 1, g);
    EXPECT_TRUE(at::equal(b, at::full({2}, 2.0f))) << b;
    // gather to global rank 3 (group rank 0), in group rank order.
    std::vector<at::Tensor> got;
    if (me == 3) got = {at::empty({1}), at::empty({1}), at::empty({1})};
    ddp::gather(at::full({1}, mine), got, 3, g);
    if (me == 3) {
      EXPECT_EQ(got[0].item<float>(), 4.0f);
      EXPECT_EQ(got[1].item<float>(), 2.0f);
      EXPECT_EQ(got[2].item<float>(), 3.0f);
    }
    // scatter from global rank 2.
    std::vector<at::Tensor> parts;
    if (me == 2) parts = {at::full({1}, 10.0f), at::full({1}, 11.0f), at::full({1}, 12.0f)};
    at::Tensor part = at::empty({1});
    ddp::scatter(part, parts, 2, g);
    EXPECT_EQ(part.item<float>(), 10.0f + static_cast<float>(g->rank()));
    // send from global 1 to global 3; recv from any source returns the global sender
    // (a tag of its own: the ring below may already be sending to rank 3).
    if (me == 1) ddp::send(at::full({1}, 7.0f), 3, 5, g);
    if (me == 3) {
      at::Tensor r = at::empty({1});
      EXPECT_EQ(ddp::recv(r, std::nullopt, 5, g), 1);
      EXPECT_EQ(r.item<float>(), 7.0f);
    }
    // A ring by global ranks 3 -> 1 -> 2 -> 3 with batch_isend_irecv.
    const std::vector<int> ring{3, 1, 2};
    const auto pos = std::find(ring.begin(), ring.end(), me) - ring.begin();
    const int next = ring[static_cast<size_t>((pos + 1) % 3)];
    const int prev = ring[static_cast<size_t>((pos + 2) % 3)];
    at::Tensor in = at::empty({1});
    std::vector<ddp::P2POp> ops{ddp::P2POp(ddp::P2POp::ISEND, at::full({1}, mine), next),
                                ddp::P2POp(ddp::P2POp::IRECV, in, prev)};
    for (auto& w : ddp::batch_isend_irecv(ops, g)) w.wait();
    EXPECT_EQ(in.item<float>(), static_cast<float>(prev + 1));
    // Objects: from global rank 2; and to global rank 1 from global 3.
    std::vector<c10::IValue> objs{c10::IValue(std::string(me == 2 ? "from two" : "?"))};
    ddp::broadcast_object_list(objs, 2, g);
    EXPECT_EQ(objs[0].toStringRef(), "from two");
    if (me == 3) ddp::send_object_list({c10::IValue(int64_t{33})}, 1, g);
    if (me == 1) {
      std::vector<c10::IValue> one(1);
      EXPECT_EQ(ddp::recv_object_list(one, 3, g), 3);
      EXPECT_EQ(one[0].toInt(), 33);
    }
    // A global rank outside the group is refused with both conventions named.
    at::Tensor t = at::ones({1});
    const std::string msg = ddp_test::error_of([&] { ddp::reduce(t, 0, ddp::ReduceOp::SUM, g); });
    EXPECT_NE(msg.find("dst 0 is not a rank of the group, whose global ranks are [3, 1, 2]"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("take global ranks"), std::string::npos) << msg;
    g->barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, GroupsTest, ::testing::Values("gloo", "shm"));

// On one host, a group of an shm (or automatic) parent gets shared memory; a gloo
// parent's groups are gloo, as in PyTorch; a named backend is kept.
TEST(Groups, TheBackendFollowsTheParent) {
  run_groups("shm", 3, [](std::shared_ptr<ddp::ProcessGroup> world) {
    auto g = ddp::new_group({0, 2}, ddp::GroupOptions(), world);
    if (g->is_member()) EXPECT_EQ(g->backend(), "shm");
    auto h = ddp::new_group({0, 1}, ddp::GroupOptions().backend("gloo"), world);
    if (h->is_member()) EXPECT_EQ(h->backend(), "gloo");
  });
  run_groups("gloo", 2, [](std::shared_ptr<ddp::ProcessGroup> world) {
    auto g = ddp::new_group({0, 1}, ddp::GroupOptions(), world);
    EXPECT_EQ(g->backend(), "gloo");
    EXPECT_NE(ddp_test::error_of([&] {
                ddp::new_group({0, 5}, ddp::GroupOptions(), world);
              }).find("rank 5 of [0, 5] is not in the parent group"),
              std::string::npos);
  });
}

}  // namespace groups_test
