// reduce, reduce_scatter, the list all_gather, gather, scatter and all_to_all_single side
// by side with Python's torch.distributed on Gloo (python/collectives_peer.py: the same
// loops, the same inputs), at world sizes 2, 3 and 4: every dtype Gloo reduces, every op
// each dtype takes, sizes 0, 1, 7 and 1000003, uneven all_to_all splits. ddp-cpp runs on
// gloo and on shm, with non-contiguous inputs and outputs where Python's are contiguous.
// Every rank's outputs must be the same bits as Python's.

#include "support/harness.h"
#include "support/util.h"

#include <ddp/distributed/process_group.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <mutex>

namespace collectives_python_test {

namespace {

constexpr int64_t kBig = 1000003;
constexpr int64_t kCols = 3;
const std::vector<int64_t> kSizes{0, 1, 7};
const std::vector<at::ScalarType> kDtypes{at::kFloat, at::kDouble, at::kInt,
                                          at::kLong,  at::kByte,   at::kBFloat16};

// python/collectives_peer.py's val(): exact values, the same bits in any summation order.
at::Tensor val(int64_t n, at::ScalarType dtype, int r, int64_t salt) {
  const at::Tensor a = (at::arange(n, at::kLong) * 5 + r * 11 + salt * 3).remainder(13);
  if (at::isFloatingType(dtype)) return ((a - 6).to(at::kDouble) / 4).to(dtype);
  if (dtype == at::kByte) return a.to(dtype);
  return (a - 6).to(dtype);
}

// A non-contiguous tensor equal to `t` (every other element of a buffer twice its size).
at::Tensor strided(const at::Tensor& t) {
  at::Tensor wide = at::zeros({t.numel(), 2}, t.options());
  wide.select(1, 0).copy_(t.reshape({-1}));
  return wide.select(1, 0).view(t.sizes());
}

std::vector<ddp::ReduceOp> ops_for(at::ScalarType dtype) {
  std::vector<ddp::ReduceOp> ops{ddp::ReduceOp::SUM, ddp::ReduceOp::PRODUCT, ddp::ReduceOp::MIN,
                                 ddp::ReduceOp::MAX};
  if (!at::isFloatingType(dtype)) {
    ops.insert(ops.end(), {ddp::ReduceOp::BAND, ddp::ReduceOp::BOR, ddp::ReduceOp::BXOR});
  }
  return ops;
}

int64_t split(int r, int s, int64_t salt) { return (r * 3 + s * 5 + salt) % 4; }

void record(std::vector<at::Tensor>& out, const at::Tensor& t) {
  const at::Tensor d = t.detach().to(at::kDouble).reshape({-1});
  if (d.numel() > 4096) {
    out.push_back(d.slice(0, 0, d.numel(), 997).clone());
    out.push_back(d.sum().reshape({1}));
  } else {
    out.push_back(d.clone());
  }
}

std::vector<at::Tensor> empties(int world, int64_t n, at::ScalarType dtype, bool non_contiguous) {
  std::vector<at::Tensor> list;
  for (int k = 0; k < world; ++k) {
    at::Tensor t = at::empty({n}, dtype);
    list.push_back(non_contiguous ? strided(t) : t);
  }
  return list;
}

// collectives_peer.py's cases(), through ddp-cpp.
at::Tensor run_cases(ddp::ProcessGroup& pg) {
  const int world = pg.size();
  const int r = pg.rank();
  std::vector<at::Tensor> out;
  int64_t salt = 0;
  for (at::ScalarType dtype : kDtypes) {
    for (int64_t n : kSizes) {
      for (ddp::ReduceOp op : ops_for(dtype)) {
        salt += 1;
        int dst = static_cast<int>(salt % world);
        at::Tensor t = strided(val(n, dtype, r, salt));
        const at::Tensor before = t.clone();
        pg.reduce(t, dst, op);
        if (r == dst) {
          record(out, t);
        } else {
          EXPECT_TRUE(at::equal(t, before)) << "reduce changed rank " << r << "'s tensor";
        }
        salt += 1;
        at::Tensor o = strided(at::empty({n}, dtype));
        std::vector<at::Tensor> inputs;
        for (int k = 0; k < world; ++k) inputs.push_back(val(n, dtype, r, salt + k));
        pg.reduce_scatter(o, inputs, op);
        record(out, o);
      }
      salt += 1;
      std::vector<at::Tensor> list = empties(world, n, dtype, /*non_contiguous=*/true);
      pg.all_gather(list, strided(val(n, dtype, r, salt)));
      for (const at::Tensor& t : list) record(out, t);

      salt += 1;
      int dst = static_cast<int>(salt % world);
      list =
          r == dst ? empties(world, n, dtype, /*non_contiguous=*/n > 1) : std::vector<at::Tensor>{};
      pg.gather(val(n, dtype, r, salt), list, dst);
      for (const at::Tensor& t : list) record(out, t);

      salt += 1;
      const int src = static_cast<int>(salt % world);
      at::Tensor o = strided(at::empty({n}, dtype));
      list.clear();
      if (r == src) {
        for (int k = 0; k < world; ++k) list.push_back(strided(val(n, dtype, k, salt)));
      }
      pg.scatter(o, list, src);
      record(out, o);

      salt += 1;
      std::vector<int64_t> ins, outs;
      for (int s = 0; s < world; ++s) {
        ins.push_back(split(r, s, salt));
        outs.push_back(split(s, r, salt));
      }
      const int64_t cols = kCols * std::max<int64_t>(n, 1);
      int64_t in_rows = 0, out_rows = 0;
      for (int s = 0; s < world; ++s) {
        in_rows += ins[s];
        out_rows += outs[s];
      }
      const at::Tensor input = val(in_rows * cols, dtype, r, salt).reshape({-1, cols});
      // Column-major: a non-contiguous input and output of the same values.
      at::Tensor o2 = at::empty({cols, out_rows}, dtype).t();
      pg.all_to_all_single(o2, input.t().contiguous().t(), outs, ins);
      record(out, o2);
    }
  }
  // One large size, float32.
  salt += 1;
  int dst = static_cast<int>(salt % world);
  at::Tensor t = val(kBig, at::kFloat, r, salt);
  pg.reduce(t, dst, ddp::ReduceOp::SUM);
  if (r == dst) record(out, t);
  salt += 1;
  at::Tensor o = at::empty({kBig});
  std::vector<at::Tensor> inputs;
  for (int k = 0; k < world; ++k) inputs.push_back(val(kBig, at::kFloat, r, salt + k));
  pg.reduce_scatter(o, inputs);
  record(out, o);
  salt += 1;
  std::vector<at::Tensor> list = empties(world, kBig, at::kFloat, false);
  pg.all_gather(list, val(kBig, at::kFloat, r, salt));
  for (const at::Tensor& l : list) record(out, l);
  salt += 1;
  std::vector<int64_t> ins, outs;
  for (int s = 0; s < world; ++s) {
    ins.push_back(kBig / world + (s < kBig % world ? 1 : 0));
    outs.push_back(kBig / world + (r < kBig % world ? 1 : 0));
  }
  int64_t out_rows = 0;
  for (int64_t v : outs) out_rows += v;
  at::Tensor o2 = at::empty({out_rows});
  pg.all_to_all_single(o2, val(kBig, at::kFloat, r, salt), outs, ins);
  record(out, o2);
  return at::cat(out);
}

at::Tensor read_doubles(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "missing " << path;
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size() / sizeof(double))}, at::kDouble);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

void matches_python(int world) {
  ddp_test::TempDir dir;
  std::string output;
  const int rc = ddp_test::run_command(std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                                           "/tests/distributed/python/collectives_peer.py " +
                                           dir.path() + " " + std::to_string(world) + " 2>&1",
                                       &output);
  if (rc == 3) GTEST_SKIP() << output;
  ASSERT_EQ(rc, 0) << output;
  for (const char* backend : {"gloo", "shm"}) {
    std::vector<at::Tensor> got(world);
    std::mutex mutex;
    ddp_test::TempDir store;
    ddp_test::run_threads(world, [&](int rank) {
      auto pg = ddp::ProcessGroup::create(
          ddp_test::file_init(store, rank, world, std::chrono::seconds(120)).backend(backend));
      pg->barrier();
      at::Tensor mine = run_cases(*pg);
      pg->barrier();
      std::lock_guard<std::mutex> lock(mutex);
      got[rank] = mine;
    });
    for (int rank = 0; rank < world; ++rank) {
      const at::Tensor want = read_doubles(
          dir.file("py_" + std::to_string(world) + "_" + std::to_string(rank) + ".bin"));
      ASSERT_EQ(got[rank].numel(), want.numel())
          << backend << ", rank " << rank << " of " << world << ": the cases recorded "
          << got[rank].numel() << " values, Python " << want.numel();
      const at::Tensor differ = (got[rank] != want).nonzero();
      EXPECT_EQ(differ.numel(), 0)
          << backend << ", rank " << rank << " of " << world << ": " << differ.size(0)
          << " value(s) differ from Python's, the first at " << differ[0].item<int64_t>() << ": "
          << got[rank][differ[0].item<int64_t>()].item<double>() << " against "
          << want[differ[0].item<int64_t>()].item<double>();
    }
  }
}

}  // namespace

TEST(CollectivesPython, MatchesTorchDistributedAt2) { matches_python(2); }
TEST(CollectivesPython, MatchesTorchDistributedAt3) { matches_python(3); }
TEST(CollectivesPython, MatchesTorchDistributedAt4) { matches_python(4); }

}  // namespace collectives_python_test
