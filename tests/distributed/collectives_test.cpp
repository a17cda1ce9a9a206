// torch.distributed's collectives beyond all_reduce, point to point and the object
// collectives, against closed forms, on gloo and shm (the comparison with Python itself
// is collectives_python_test.cpp): all_to_all with a shape per pair, a ring, a pipeline
// of 4 stages both ways, seeded random batch_isend_irecv patterns, recv from any source,
// objects of every kind, AVG, world size 1, and every misuse refused on the rank that
// made it, before anything is sent.

#include "support/harness.h"

#include <ddp/distributed/process_group.h>
#include <ddp/errors.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace collectives_test {

namespace {

void run_groups(const std::string& backend, int world,
                const std::function<void(ddp::ProcessGroup&)>& fn, const std::string& debug = "") {
  ddp_test::TempDir dir;
  ddp_test::run_threads(world, [&](int rank) {
    auto pg = ddp::ProcessGroup::create(
        ddp_test::file_init(dir, rank, world).backend(backend).debug(debug));
    pg->barrier();
    fn(*pg);
    pg->barrier();
  });
}

// What rank `from` sends rank `to`: 1000 * from + 10 * to + i, as float.
at::Tensor message(int from, int to, int64_t n) {
  return at::arange(n, at::kFloat) + 1000.0 * from + 10.0 * to;
}

}  // namespace

class MoreCollectivesTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MoreCollectivesTest, AllToAllMovesAShapePerPair) {
  run_groups(GetParam(), 3, [](ddp::ProcessGroup& pg) {
    const int w = pg.size(), r = pg.rank();
    std::vector<at::Tensor> in, out;
    for (int s = 0; s < w; ++s) {
      in.push_back(message(r, s, r + s + 1));
      out.push_back(at::full({s + r + 1}, -1.0f));
    }
    pg.all_to_all(out, in);
    for (int s = 0; s < w; ++s) {
      EXPECT_TRUE(at::equal(out[s], message(s, r, s + r + 1))) << "from rank " << s;
    }
    // all_to_all_single with uneven splits: rank r sends s (r + s) % 3 rows of 2.
    std::vector<int64_t> ins, outs;
    for (int s = 0; s < w; ++s) {
      ins.push_back((r + s) % 3);
      outs.push_back((s + r) % 3);
    }
    std::vector<at::Tensor> parts, want;
    for (int s = 0; s < w; ++s) {
      parts.push_back(message(r, s, 2 * ins[s]).reshape({-1, 2}));
      want.push_back(message(s, r, 2 * outs[s]).reshape({-1, 2}));
    }
    at::Tensor got = at::empty({at::cat(want).size(0), 2});
    pg.all_to_all_single(got, at::cat(parts), outs, ins);
    EXPECT_TRUE(at::equal(got, at::cat(want)));
  });
}

TEST_P(MoreCollectivesTest, ARingOfSendsAndReceives) {
  run_groups(GetParam(), 4, [](ddp::ProcessGroup& pg) {
    const int w = pg.size(), r = pg.rank();
    const int next = (r + 1) % w, prev = (r + w - 1) % w;
    // Launched both ways at once.
    at::Tensor got = at::empty({5});
    ddp::Work recv = pg.irecv(got, prev);
    ddp::Work send = pg.isend(message(r, next, 5), next);
    send.wait();
    recv.wait();
    EXPECT_EQ(recv.source_rank(), prev);
    EXPECT_TRUE(at::equal(got, message(prev, r, 5)));
    // Blocking calls, even ranks sending first, with a tag.
    at::Tensor got2 = at::empty({3, 2}).t();  // non-contiguous
    if (r % 2 == 0) {
      pg.send(message(r, next, 6).reshape({2, 3}), next, /*tag=*/7);
      EXPECT_EQ(pg.recv(got2, prev, /*tag=*/7), prev);
    } else {
      EXPECT_EQ(pg.recv(got2, prev, /*tag=*/7), prev);
      pg.send(message(r, next, 6).reshape({2, 3}), next, /*tag=*/7);
    }
    EXPECT_TRUE(at::equal(got2, message(prev, r, 6).reshape({2, 3})));
  });
}

// Four stages, three micro-batches: activations go 0 -> 3 (each stage adds its rank),
// gradients come back 3 -> 0 (each stage doubles them), as a pipeline's schedule does.
TEST_P(MoreCollectivesTest, APipelineOfFourStagesBothWays) {
  run_groups(GetParam(), 4, [](ddp::ProcessGroup& pg) {
    const int w = pg.size(), r = pg.rank();
    for (int mb = 0; mb < 3; ++mb) {
      at::Tensor act = at::full({8}, static_cast<float>(mb));
      if (r > 0) pg.recv(act, r - 1);
      act += r;
      if (r < w - 1) {
        pg.send(act, r + 1);
      } else {
        EXPECT_TRUE(at::equal(act, at::full({8}, mb + 6.0f)));
      }
    }
    for (int mb = 0; mb < 3; ++mb) {
      at::Tensor grad = at::full({8}, 1.0f + mb);
      if (r < w - 1) pg.recv(grad, r + 1);
      grad *= 2;
      if (r > 0) {
        pg.send(grad, r - 1);
      } else {
        EXPECT_TRUE(at::equal(grad, at::full({8}, 16.0f * (1 + mb))));
      }
    }
  });
}

// Seeded random patterns: each round, every ordered pair exchanges 0 to 2 messages, and
// each rank lists its sends and receives in its own random order.
TEST_P(MoreCollectivesTest, BatchIsendIrecvInAnyOrder) {
  run_groups(GetParam(), 4, [](ddp::ProcessGroup& pg) {
    const int w = pg.size(), r = pg.rank();
    std::mt19937 shared(2024);  // the same pattern on every rank
    std::mt19937 mine(77 + r);  // each rank's own order
    for (int round = 0; round < 20; ++round) {
      std::vector<std::vector<int>> count(w, std::vector<int>(w, 0));
      for (int a = 0; a < w; ++a) {
        for (int b = 0; b < w; ++b) count[a][b] = a == b ? 0 : static_cast<int>(shared() % 3);
      }
      std::vector<ddp::P2POp> ops;
      std::vector<std::pair<at::Tensor, at::Tensor>> expect;  // (received into, want)
      for (int s = 0; s < w; ++s) {
        for (int k = 0; k < count[r][s]; ++k) {
          ops.emplace_back(ddp::P2POp::ISEND, message(r, s, 4) + 100000.0 * round + 0.5 * k, s, k);
        }
        for (int k = 0; k < count[s][r]; ++k) {
          at::Tensor into = at::empty({4});
          ops.emplace_back(ddp::P2POp::IRECV, into, s, k);
          expect.emplace_back(into, message(s, r, 4) + 100000.0 * round + 0.5 * k);
        }
      }
      if (ops.empty()) continue;
      std::shuffle(ops.begin(), ops.end(), mine);
      for (ddp::Work& work : pg.batch_isend_irecv(ops)) work.wait();
      for (const auto& e : expect) EXPECT_TRUE(at::equal(e.first, e.second)) << "round " << round;
    }
  });
}

TEST_P(MoreCollectivesTest, RecvFromAnySourceNamesTheSender) {
  run_groups(GetParam(), 3, [](ddp::ProcessGroup& pg) {
    const int r = pg.rank();
    if (r == 0) {
      std::set<int> senders;
      for (int i = 0; i < 2; ++i) {
        at::Tensor got = at::empty({4});
        const int from = pg.recv(got);
        senders.insert(from);
        EXPECT_TRUE(at::equal(got, message(from, 0, 4)));
      }
      EXPECT_EQ(senders, (std::set<int>{1, 2}));
    } else {
      pg.send(message(r, 0, 4), 0);
    }
  });
}

TEST_P(MoreCollectivesTest, ObjectsOfEveryKind) {
  run_groups(GetParam(), 3, [](ddp::ProcessGroup& pg) {
    const int w = pg.size(), r = pg.rank();
    c10::Dict<std::string, int64_t> dict;
    dict.insert("rank", r);
    dict.insert("world", w);
    auto obj = [&](int who) {
      c10::Dict<std::string, int64_t> d;
      d.insert("rank", who);
      d.insert("world", w);
      return std::vector<c10::IValue>{c10::IValue(std::string("rank ") + std::to_string(who)),
                                      c10::IValue(int64_t{who}),
                                      c10::IValue(0.5 * who),
                                      c10::IValue(c10::List<int64_t>({who, who + 1})),
                                      c10::IValue(d),
                                      c10::IValue(at::full({2, 2}, static_cast<float>(who)))};
    };
    auto same = [](const c10::IValue& a, const c10::IValue& b) {
      if (a.isTensor()) return b.isTensor() && at::equal(a.toTensor(), b.toTensor());
      return a == b;
    };
    // broadcast_object_list from rank 1.
    std::vector<c10::IValue> list = r == 1 ? obj(1) : std::vector<c10::IValue>(6);
    pg.broadcast_object_list(list, 1);
    for (size_t i = 0; i < list.size(); ++i) EXPECT_TRUE(same(list[i], obj(1)[i])) << i;
    // all_gather_object.
    std::vector<c10::IValue> all(w);
    pg.all_gather_object(all, c10::IValue(c10::ivalue::Tuple::create(obj(r))));
    for (int s = 0; s < w; ++s) {
      const auto elems = all[s].toTupleRef().elements();
      for (size_t i = 0; i < elems.size(); ++i) EXPECT_TRUE(same(elems[i], obj(s)[i]));
    }
    // gather_object to rank 2.
    std::vector<c10::IValue> gathered(r == 2 ? w : 0);
    pg.gather_object(c10::IValue(std::string(static_cast<size_t>(10 * r + 1), 'x')), gathered, 2);
    for (int s = 0; s < static_cast<int>(gathered.size()); ++s) {
      EXPECT_EQ(gathered[s].toStringRef(), std::string(static_cast<size_t>(10 * s + 1), 'x'));
    }
    // scatter_object_list from rank 0.
    std::vector<c10::IValue> one(1);
    std::vector<c10::IValue> inputs;
    if (r == 0) {
      for (int s = 0; s < w; ++s) inputs.push_back(obj(s)[3]);
    }
    pg.scatter_object_list(one, inputs, 0);
    EXPECT_TRUE(same(one[0], obj(r)[3]));
    // send_object_list / recv_object_list around a ring.
    std::vector<c10::IValue> got(6);
    if (r == 0) {
      pg.send_object_list(obj(r), 1);
      EXPECT_EQ(pg.recv_object_list(got), w - 1);
    } else {
      EXPECT_EQ(pg.recv_object_list(got, r - 1), r - 1);
      pg.send_object_list(obj(r), (r + 1) % w);
    }
    const int from = (r + w - 1) % w;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same(got[i], obj(from)[i])) << i;
  });
}

TEST_P(MoreCollectivesTest, AvgDividesTheSum) {
  run_groups(GetParam(), 3, [](ddp::ProcessGroup& pg) {
    const int w = pg.size(), r = pg.rank();
    at::Tensor t = at::full({5}, static_cast<float>(r + 1));
    pg.reduce(t, 1, ddp::ReduceOp::AVG);
    EXPECT_TRUE(at::equal(t, at::full({5}, r == 1 ? 2.0f : r + 1.0f)));
    std::vector<at::Tensor> in;
    for (int s = 0; s < w; ++s) in.push_back(at::full({4}, 3.0f * (r + s)));
    at::Tensor out = at::empty({4});
    ddp::Work work = pg.reduce_scatter_async(out, in, ddp::ReduceOp::AVG);
    work.wait();
    work.wait();  // a second wait divides nothing twice
    EXPECT_TRUE(at::allclose(out, at::full({4}, 3.0f * (1 + r))));
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, MoreCollectivesTest, ::testing::Values("gloo", "shm"));

// At world size 1 every collective is the identity (or a copy), as in PyTorch.
TEST(MoreCollectives, WorldSizeOneIsTheIdentity) {
  ddp_test::TempDir dir;
  auto pg = ddp::ProcessGroup::create(ddp_test::file_init(dir, 0, 1));
  at::Tensor t = at::arange(4, at::kFloat);
  pg->reduce(t, 0, ddp::ReduceOp::SUM);
  EXPECT_TRUE(at::equal(t, at::arange(4, at::kFloat)));
  std::vector<at::Tensor> list{at::empty({4})};
  pg->gather(t, list, 0);
  EXPECT_TRUE(at::equal(list[0], t));
  at::Tensor o = at::empty({4});
  pg->scatter(o, {t * 2}, 0);
  EXPECT_TRUE(at::equal(o, t * 2));
  pg->all_to_all_single(o, t);
  EXPECT_TRUE(at::equal(o, t));
  std::vector<c10::IValue> objects(1);
  pg->all_gather_object(objects, c10::IValue(std::string("alone")));
  EXPECT_EQ(objects[0].toStringRef(), "alone");
  EXPECT_NE(ddp_test::error_of([&] { pg->recv(o); }).find("no other rank"), std::string::npos);
}

// Every misuse a rank can see alone is refused there, before anything is sent: the
// other rank runs a plain barrier meanwhile, and both go on.
TEST(MoreCollectives, MisuseIsRefusedOnTheRankThatMadeIt) {
  run_groups("gloo", 2, [](ddp::ProcessGroup& pg) {
    if (pg.rank() == 1) return;
    at::Tensor f = at::ones({4});
    at::Tensor i = at::ones({4}, at::kLong);
    std::vector<at::Tensor> two{at::empty({4}), at::empty({4})};
    std::vector<at::Tensor> three{at::empty({4}), at::empty({4}), at::empty({4})};
    auto refused = [](const std::function<void()>& f, const std::string& words) {
      const std::string msg = ddp_test::error_of(f);
      EXPECT_NE(msg.find(words), std::string::npos) << "got: " << msg;
      EXPECT_NE(msg.find("rank 0"), std::string::npos) << "no rank in: " << msg;
    };
    refused([&] { pg.reduce(f, 2); }, "0..1, but got 2");
    refused([&] { pg.send(f, 0); }, "itself");
    refused([&] { pg.isend(f, -1); }, "but got -1");
    refused([&] { pg.reduce(f, 0, ddp::ReduceOp::BAND); }, "integral or bool");
    refused([&] { pg.reduce(i, 0, ddp::ReduceOp::AVG); }, "floating-point");
    refused([&] { pg.reduce(f, 0, ddp::ReduceOp::premul_sum(2.0)); }, "only on the nccl");
    refused([&] { pg.gather(f, three, 0); }, "one tensor per rank (2), but holds 3");
    refused([&] { pg.gather(f, two, 1); }, "must be empty on the ranks other than dst");
    refused([&] { pg.scatter(f, two, 1); }, "must be empty on the ranks other than src");
    std::vector<at::Tensor> wrong{at::empty({4}), at::empty({5})};
    refused([&] { pg.all_gather(wrong, f); }, "shape and dtype of tensor");
    refused([&] { pg.reduce_scatter(f, three); }, "one tensor per rank (2), but holds 3");
    at::Tensor o = at::empty({3});
    refused([&] { pg.all_to_all_single(o, at::empty({3})); }, "2 equal parts");
    refused([&] { pg.all_to_all_single(o, at::empty({3}), {1, 2}, {2, 2}); }, "adds up to 4");
    std::vector<c10::IValue> objects(3);
    refused([&] { pg.all_gather_object(objects, c10::IValue(1)); }, "one entry per rank (2)");
  });
}

// What one rank cannot see, DDP_DEBUG=detail finds: shapes that differ between ranks, and
// all_to_all_single's split sizes that do not agree pairwise. Every rank gets the error.
TEST(MoreCollectives, DebugDetailNamesWhatDiffersAcrossRanks) {
  run_groups(
      "gloo", 2,
      [](ddp::ProcessGroup& pg) {
        const int r = pg.rank();
        at::Tensor t = at::ones({4 + r});
        const std::string msg = ddp_test::error_of([&] { pg.reduce(t, 0); });
        EXPECT_NE(msg.find("reduce(sum) "), std::string::npos) << msg;
        std::vector<int64_t> ins{1, 1}, outs{1 + r, 1};  // rank 1 expects 2 rows from rank 0
        at::Tensor o = at::empty({2 + r});
        const std::string msg2 =
            ddp_test::error_of([&] { pg.all_to_all_single(o, at::ones({2}), outs, ins); });
        EXPECT_NE(msg2.find("rank 0 sends rank 1 1 row(s)"), std::string::npos) << msg2;
      },
      "detail");
}

}  // namespace collectives_test
