// ddp::dcp against PyTorch's own torch.distributed.checkpoint: C++ fully_shard at 3 ranks
// saves and Python's FSDP2 at 2 ranks dcp.loads it; Python's FSDP2 at 2 ranks dcp.saves
// and C++ fully_shard at 3 ranks and a plain C++ model load it; Python's dcp_to_torch_save
// converts a C++ checkpoint. Every comparison is bit for bit.

#include "serialize/dcp_test_models.h"
#include "formats/atomic_file.h"
#include "formats/pickle_io.h"
#include "support/harness.h"
#include "support/util.h"

#include <ddp/fsdp/fully_shard.h>
#include <ddp/serialize/dcp.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <cstdio>
#include <string>

namespace dcp_python_test {

namespace {

using ddp_test::TinyGptImpl;

using ddp_test::make_tiny_gpt;
using ddp_test::shard_tiny_gpt;

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
  const at::Tensor want = flat(*make_tiny_gpt(5));
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    auto model = make_tiny_gpt(5);
    shard_tiny_gpt(model, pg);
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
  auto ref = make_tiny_gpt(5);
  for (const auto& p : ref->named_parameters()) {
    ASSERT_TRUE(model.contains(p.key())) << p.key();
    EXPECT_TRUE(ddp_test::same_bits(model.at(p.key()).toTensor(), p.value().detach())) << p.key();
  }
}

TEST(DcpPython, Fsdp2AtTwoSavesAndFullyShardAtThreeAndAPlainModelLoad) {
  ddp_test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  const at::Tensor init = flat(*make_tiny_gpt(5));
  ddp_test::write_bytes(dir.file("init.bin"), init);
  if (!peer("save " + dir.path() + " " + ckpt + " 2")) GTEST_SKIP();
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    auto model = make_tiny_gpt(9);
    shard_tiny_gpt(model, pg);
    ddp::dcp::StateDict state;
    state.add_model(*model).add_object("step", int64_t{0});
    ddp::dcp::load(state, ckpt);
    EXPECT_EQ(state.object("step").toInt(), 7);
    const auto full = ddp::full_state_dict(*model);
    if (pg.rank() != 0) return;
    auto ref = make_tiny_gpt(5);
    for (const auto& p : ref->named_parameters()) {
      ASSERT_TRUE(full.contains(p.key())) << p.key();
      EXPECT_TRUE(ddp_test::same_bits(full.at(p.key()), p.value().detach())) << p.key();
    }
  });
  auto plain = make_tiny_gpt(9);
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

// AdamW: C++ fully_shard at 3 ranks trains two steps and saves model and optimizer; FSDP2
// with AdamW at 2 ranks dcp.loads them through get_state_dict/set_state_dict and saves
// them again: the two checkpoints hold the same bits. Then one more step on each side with
// the same batch gives the same loss and parameters.
TEST(DcpPython, AdamWStateLoadsIntoFsdp2AndTheNextStepAgrees) {
  ddp_test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  constexpr int64_t kRows = 6;  // 2 per rank here, 3 per rank in Python
  auto gen = at::make_generator<at::CPUGeneratorImpl>(77);
  const at::Tensor x = at::randint(ddp_test::kVocab, {kRows, ddp_test::kCtx}, gen, at::kLong);
  const at::Tensor y = at::randint(ddp_test::kVocab, {kRows, ddp_test::kCtx}, gen, at::kLong);
  ddp_test::write_bytes(dir.file("x.bin"), x);
  ddp_test::write_bytes(dir.file("y.bin"), y);
  double cpp_loss = 0;
  at::Tensor cpp_params;
  ddp_test::run_thread_groups(3, [&](ddp::ProcessGroup& pg) {
    auto model = make_tiny_gpt(5);
    auto unit = shard_tiny_gpt(model, pg);
    torch::optim::AdamW opt(unit->parameters(), torch::optim::AdamWOptions(1e-2));
    auto loss_on = [&](const at::Tensor& xs, const at::Tensor& ys) {
      return at::cross_entropy_loss(unit(xs).reshape({-1, ddp_test::kVocab}), ys.reshape({-1}));
    };
    for (int step = 0; step < 2; ++step) {
      auto g = at::make_generator<at::CPUGeneratorImpl>(300 + 10 * step + pg.rank());
      loss_on(at::randint(ddp_test::kVocab, {2, ddp_test::kCtx}, g, at::kLong),
              at::randint(ddp_test::kVocab, {2, ddp_test::kCtx}, g, at::kLong))
          .backward();
      opt.step();
      opt.zero_grad();
    }
    ddp::dcp::StateDict state;
    state.add_model(*model).add_optimizer(opt, *model);
    ddp::dcp::save(state, ckpt, ddp::dcp::SaveOptions().process_group(ddp_test::borrow(pg)));
    const int r = pg.rank();
    at::Tensor loss = loss_on(x.slice(0, 2 * r, 2 * r + 2), y.slice(0, 2 * r, 2 * r + 2));
    loss.backward();
    opt.step();
    at::Tensor mean = loss.detach().clone();
    pg.all_reduce(mean);
    const auto full = ddp::full_state_dict(*model);
    if (r == 0) {
      cpp_loss = mean.item<double>() / 3;
      std::vector<at::Tensor> parts;
      for (const auto& p : make_tiny_gpt(5)->named_parameters()) {
        parts.push_back(full.at(p.key()).reshape({-1}));
      }
      cpp_params = at::cat(parts);
    }
  });
  if (!peer("optim " + dir.path() + " " + ckpt + " 2")) GTEST_SKIP();
  // What Python loaded, saved again by Python, equals what C++ saved.
  ddp::dcp::to_torch_save(ckpt, dir.file("cpp.pt"));
  ddp::dcp::to_torch_save(ckpt + "_py", dir.file("py.pt"));
  const auto a =
      ddp::detail::unpickle(ddp::detail::read_file(dir.file("cpp.pt")), "cpp").toGenericDict();
  const auto b =
      ddp::detail::unpickle(ddp::detail::read_file(dir.file("py.pt")), "py").toGenericDict();
  for (const char* part : {"model", "optim"}) {
    const auto sa = a.at(part).toGenericDict();
    const auto sb = b.at(part).toGenericDict();
    if (std::string(part) == "optim") {
      const auto ta = sa.at("state").toGenericDict(), tb = sb.at("state").toGenericDict();
      ASSERT_EQ(ta.size(), tb.size());
      for (const auto& e : ta) {
        const auto pa = e.value().toGenericDict();
        const auto pb = tb.at(e.key()).toGenericDict();
        for (const auto& k : pa) {
          EXPECT_TRUE(ddp_test::same_bits(k.value().toTensor(), pb.at(k.key()).toTensor()))
              << e.key().toStringRef() << "." << k.key().toStringRef();
        }
      }
      const auto ga = sa.at("param_groups").toList().get(0).toGenericDict();
      const auto gb = sb.at("param_groups").toList().get(0).toGenericDict();
      EXPECT_EQ(ga.at("lr").toDouble(), gb.at("lr").toDouble());
      EXPECT_EQ(ga.at("weight_decay").toDouble(), gb.at("weight_decay").toDouble());
      continue;
    }
    for (const auto& e : sa) {
      EXPECT_TRUE(ddp_test::same_bits(e.value().toTensor(), sb.at(e.key()).toTensor()))
          << e.key().toStringRef();
    }
  }
  const double py_loss = std::stod(ddp::detail::read_file(dir.file("loss.txt")));
  EXPECT_NEAR(py_loss, cpp_loss, 1e-6);
  const at::Tensor py = ddp_test::read_floats(dir.file("py.bin"), {cpp_params.numel()});
  EXPECT_LE((py - cpp_params).abs().max().item<double>(), 1e-5);
  std::printf("one step after the exchange: losses %.9g (C++) and %.9g (PyTorch); parameters "
              "within %.3g\n",
              cpp_loss, py_loss, (py - cpp_params).abs().max().item<double>());
}

}  // namespace dcp_python_test
