// DeviceMesh: PyTorch's layout (the 2 x 4 ("dp", "tp") example of its docstring, closed
// forms for submeshes and flattening) and, side by side with Python's init_device_mesh,
// the groups, local ranks, coordinates and submeshes of a 2 x 2 and a 2 x 3 mesh on
// every rank.

#include "support/harness.h"

#include <ddp/distributed/device_mesh.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <mutex>
#include <sstream>

namespace device_mesh_test {

namespace {

void run_world(int world, const std::function<void(std::shared_ptr<ddp::ProcessGroup>)>& fn) {
  ddp_test::TempDir dir;
  ddp_test::run_threads(world, [&](int rank) {
    auto pg = ddp::ProcessGroup::create(ddp_test::file_init(dir, rank, world).backend("gloo"));
    pg->barrier();
    fn(pg);
    pg->barrier();
  });
}

ddp::DeviceMesh mesh_of(const std::vector<int64_t>& shape, const std::vector<std::string>& names,
                        const std::shared_ptr<ddp::ProcessGroup>& world) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return ddp::DeviceMesh("cpu", at::arange(n, at::kLong).view(shape), names, world);
}

std::string csv(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::vector<int64_t> ranks(const std::shared_ptr<ddp::ProcessGroup>& g) {
  return std::vector<int64_t>(g->ranks().begin(), g->ranks().end());
}

std::vector<int64_t> values(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace

// The docstring's example: 8 ranks as 2 x 4.
TEST(DeviceMesh, PyTorchsTwoByFourExample) {
  run_world(8, [](std::shared_ptr<ddp::ProcessGroup> world) {
    const int64_t r = world->rank();
    auto mesh = mesh_of({2, 4}, {"dp", "tp"}, world);
    EXPECT_EQ(ranks(mesh.get_group("tp")),
              (std::vector<int64_t>{r / 4 * 4, r / 4 * 4 + 1, r / 4 * 4 + 2, r / 4 * 4 + 3}));
    EXPECT_EQ(ranks(mesh.get_group("dp")), (std::vector<int64_t>{r % 4, r % 4 + 4}));
    EXPECT_EQ(mesh.get_local_rank("tp"), r % 4);
    EXPECT_EQ(mesh.get_local_rank(0), r / 4);
    EXPECT_EQ(*mesh.get_coordinate(), (std::vector<int64_t>{r / 4, r % 4}));
    EXPECT_EQ(mesh.size(), 8);
    EXPECT_EQ(mesh.size("tp"), 4);
    ddp::DeviceMesh tp = mesh["tp"];
    EXPECT_EQ(tp.ndim(), 1);
    EXPECT_EQ(values(tp.mesh()), ranks(mesh.get_group("tp")));
    EXPECT_EQ(tp.get_group(), mesh.get_group("tp"));  // the same group, not a new one
    // The tp group works: a sum over it.
    at::Tensor t = at::full({1}, static_cast<float>(r));
    tp.get_group()->all_reduce(t);
    EXPECT_EQ(t.item<float>(), static_cast<float>(4 * (r / 4 * 4) + 6));
    EXPECT_NE(ddp_test::error_of([&] { mesh.get_group(); }).find("has 2 dimensions"),
              std::string::npos);
    EXPECT_NE(ddp_test::error_of([&] { mesh["pp"]; }).find("no dimension is named \"pp\""),
              std::string::npos);
  });
}

// 8 ranks as (dp, cp, tp) = 2 x 2 x 2: rank = 4 dp + 2 cp + tp.
TEST(DeviceMesh, SubmeshesAndFlattening) {
  run_world(8, [](std::shared_ptr<ddp::ProcessGroup> world) {
    const int64_t r = world->rank();
    const int64_t dp = r / 4, cp = r / 2 % 2, tp = r % 2;
    auto mesh = mesh_of({2, 2, 2}, {"dp", "cp", "tp"}, world);
    ddp::DeviceMesh dpcp = mesh[std::vector<std::string>{"dp", "cp"}];
    EXPECT_EQ(dpcp.shape(), (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(values(dpcp.mesh()), (std::vector<int64_t>{tp, 2 + tp, 4 + tp, 6 + tp}));
    ddp::DeviceMesh cpdp = mesh[std::vector<std::string>{"cp", "dp"}];
    EXPECT_EQ(values(cpdp.mesh()), (std::vector<int64_t>{tp, 4 + tp, 2 + tp, 6 + tp}));
    EXPECT_EQ(cpdp.get_local_rank("dp"), dp);
    EXPECT_EQ(*cpdp.get_coordinate(), (std::vector<int64_t>{cp, dp}));
    // Flattening (dp, cp): one group per tp coordinate, dp-major.
    ddp::DeviceMesh flat = dpcp.flatten();
    EXPECT_EQ(flat.mesh_dim_names(), (std::vector<std::string>{"dp_cp"}));
    EXPECT_EQ(ranks(flat.get_group()), (std::vector<int64_t>{tp, 2 + tp, 4 + tp, 6 + tp}));
    EXPECT_EQ(flat.get_local_rank(), 2 * dp + cp);
    EXPECT_EQ(ranks(mesh["dp_cp"].get_group()), ranks(flat.get_group()));  // found by name
    at::Tensor t = at::ones({1});
    flat.get_group()->all_reduce(t);
    EXPECT_EQ(t.item<float>(), 4.0f);
  });
}

// Side by side with PyTorch: every rank's groups, local ranks, coordinate and submeshes.
void matches_python(int64_t d0, int64_t d1) {
  const int world = static_cast<int>(d0 * d1);
  ddp_test::TempDir dir;
  std::string output;
  const int rc =
      ddp_test::run_command(std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                                "/tests/distributed/python/mesh_peer.py " + dir.path() + " " +
                                std::to_string(d0) + " " + std::to_string(d1) + " 2>&1",
                            &output);
  if (rc == 3) GTEST_SKIP() << output;
  ASSERT_EQ(rc, 0) << output;
  std::vector<std::string> got(world);
  std::mutex mutex;
  run_world(world, [&](std::shared_ptr<ddp::ProcessGroup> pg) {
    auto mesh = mesh_of({d0, d1}, {"dp", "tp"}, pg);
    std::vector<std::string> parts;
    for (const char* name : {"dp", "tp"}) {
      parts.push_back(std::string(name) + ":" + csv(ranks(mesh.get_group(name))));
      parts.push_back(std::string("lr_") + name + ":" + std::to_string(mesh.get_local_rank(name)));
      parts.push_back(std::string("sub_") + name + ":" + csv(values(mesh[name].mesh())));
    }
    parts.push_back("coord:" + csv(*mesh.get_coordinate()));
    std::string line;
    for (size_t i = 0; i < parts.size(); ++i) line += (i ? "|" : "") + parts[i];
    std::lock_guard<std::mutex> lock(mutex);
    got[static_cast<size_t>(pg->rank())] = line;
  });
  for (int r = 0; r < world; ++r) {
    std::ifstream f(dir.file("mesh_" + std::to_string(r) + ".txt"));
    std::stringstream want;
    want << f.rdbuf();
    EXPECT_EQ(got[static_cast<size_t>(r)], want.str()) << "rank " << r;
  }
}

TEST(DeviceMeshPython, TwoByTwoMatchesPyTorch) { matches_python(2, 2); }
TEST(DeviceMeshPython, TwoByThreeMatchesPyTorch) { matches_python(2, 3); }

}  // namespace device_mesh_test
