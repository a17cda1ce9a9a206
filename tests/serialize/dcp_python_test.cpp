// ddp::dcp against PyTorch's own torch.distributed.checkpoint: C++ fully_shard at 3 ranks
// saves and Python's FSDP2 at 2 ranks dcp.loads it; Python's FSDP2 at 2 ranks dcp.saves
// and C++ fully_shard at 3 ranks and a plain C++ model load it; Python's dcp_to_torch_save
// converts a C++ checkpoint. Every comparison is bit for bit.

#include "parallel/fsdp_test_models.h"
#include "formats/atomic_file.h"
#include "formats/pickle_io.h"
#include "support/harness.h"
#include "support/util.h"

#include <ddp/fsdp/fully_shard.h>
#include <ddp/serialize/dcp.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

namespace dcp_python_test {

namespace {

using ddp_test::TinyGptImpl;

std::shared_ptr<TinyGptImpl> make_model(uint64_t seed) {
  auto model = std::make_shared<TinyGptImpl>();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.3);
  return model;
}

void shard(const std::shared_ptr<TinyGptImpl>& model, ddp::ProcessGroup& pg) {
  auto opts = ddp::FullyShardOptions().process_group(ddp_test::borrow(pg));
  for (size_t i = 0; i < model->blocks->size(); ++i) {
    ddp::fully_shard(model->blocks->ptr<ddp_test::BlockImpl>(i), opts);
  }
  ddp::fully_shard(model, opts);
}

at::Tensor flat(const torch::nn::Module& model) {
  std::vector<at::Tensor> parts;
  for (const auto& p : model.parameters()) parts.push_back(p.detach().reshape({-1}));
  return at::cat(parts);
}

// Runs the peer; returns false (and skips) when this PyTorch has no DCP or FSDP2.
bool peer(const std::string& args) {
  std::string output;
  const int rc = ddp_test::run_command(std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                                           "/tests/serialize/python/dcp_peer.py " + args + " 2>&1",
                                       &output);
  if (rc == 3) {
    std::printf("skipped: %s\n", output.c_str());
    return false;
  }
  EXPECT_EQ(rc, 0) << output;
  return rc == 0;
}

}  // namespace

TEST(DcpPython, FullyShardAtThreeSavesAndFsdp2AtTwoLoads) {
  ddp_test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  const at::Tensor want = flat(*make_model(5));
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    auto model = make_model(5);
    shard(model, pg);
    ddp::dcp::StateDict state;
    state.add_model(*model).add_object("step", int64_t{7});
    ddp::dcp::save(state, ckpt, ddp::dcp::SaveOptions().process_group(ddp_test::borrow(pg)));
  });
  if (!peer("load " + dir.path() + " " + ckpt + " 2")) GTEST_SKIP();
  const at::Tensor py = ddp_test::read_floats(dir.file("py.bin"), {want.numel()});
  EXPECT_TRUE(ddp_test::same_bits(py, want))
      << "max |difference| " << (py - want).abs().max().item<double>();
  // Python's own converter reads the C++ checkpoint, and so does torch.load after it.
  ASSERT_TRUE(peer("to_torch_save " + ckpt + " " + dir.file("py_whole.pt")));
  const auto whole =
      ddp::detail::unpickle(ddp::detail::read_file(dir.file("py_whole.pt")), "py_whole.pt")
          .toGenericDict();
  EXPECT_EQ(whole.at("step").toInt(), 7);
  const auto model = whole.at("model").toGenericDict();
  auto ref = make_model(5);
  for (const auto& p : ref->named_parameters()) {
    ASSERT_TRUE(model.contains(p.key())) << p.key();
    EXPECT_TRUE(ddp_test::same_bits(model.at(p.key()).toTensor(), p.value().detach())) << p.key();
  }
}

TEST(DcpPython, Fsdp2AtTwoSavesAndFullyShardAtThreeAndAPlainModelLoad) {
  ddp_test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  const at::Tensor init = flat(*make_model(5));
  ddp_test::write_bytes(dir.file("init.bin"), init);
  if (!peer("save " + dir.path() + " " + ckpt + " 2")) GTEST_SKIP();
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    auto model = make_model(9);
    shard(model, pg);
    ddp::dcp::StateDict state;
    state.add_model(*model).add_object("step", int64_t{0});
    ddp::dcp::load(state, ckpt);
    EXPECT_EQ(state.object("step").toInt(), 7);
    const auto full = ddp::full_state_dict(*model);
    if (pg.rank() != 0) return;
    auto ref = make_model(5);
    for (const auto& p : ref->named_parameters()) {
      ASSERT_TRUE(full.contains(p.key())) << p.key();
      EXPECT_TRUE(ddp_test::same_bits(full.at(p.key()), p.value().detach())) << p.key();
    }
  });
  auto plain = make_model(9);
  ddp::dcp::StateDict state;
  state.add_model(*plain);
  ddp::dcp::load(state, ckpt);
  EXPECT_TRUE(ddp_test::same_bits(flat(*plain), init));
  // C++'s converter on Python's checkpoint.
  ddp::dcp::to_torch_save(ckpt, dir.file("whole.pt"));
  const auto whole = ddp::detail::unpickle(ddp::detail::read_file(dir.file("whole.pt")), "whole.pt")
                         .toGenericDict();
  EXPECT_EQ(whole.at("step").toInt(), 7);
  EXPECT_EQ(whole.at("model").toGenericDict().size(), plain->named_parameters().size());
}

}  // namespace dcp_python_test
