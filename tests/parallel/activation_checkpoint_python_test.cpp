// ddp::checkpoint against PyTorch's torch.utils.checkpoint.checkpoint(fn, x,
// use_reentrant=False) (the configuration's Python, DDP_TEST_PYTHON, on the same
// LibTorch, with the same intra-op thread count): the same block with dropout, the same
// weights, input and seed. The output, the gradients of the input and of every parameter,
// and where the recompute leaves the global generator must agree bit for bit, with the
// input requiring grad and without (where only the parameters get gradients, which
// use_reentrant=True would not give).

#include "parallel/activation_checkpoint_test_models.h"
#include "support/util.h"

#include <cstdio>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace activation_checkpoint_python_test {

namespace {

at::Tensor flat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> parts;
  for (const auto& t : ts) parts.push_back(t.detach().reshape({-1}).to(at::kFloat));
  return at::cat(parts);
}

TEST(ActivationCheckpointPython, MatchesTorchUtilsCheckpoint) {
  ddp_test::TempDir dir;
  auto block = std::make_shared<ddp_test::DropBlockImpl>();
  ddp_test::init_params(*block, 31);
  const at::Tensor x0 = ddp_test::randn({5, ddp_test::kDropDim}, 32);
  ddp_test::write_floats(dir.file("params.bin"), flat(block->parameters()));
  ddp_test::write_floats(dir.file("x.bin"), x0);

  std::string output;
  const int rc =
      ddp_test::run_command(std::string(DDP_TEST_PYTHON) + " " + DDP_SOURCE_DIR +
                                "/tests/parallel/python/checkpoint_peer.py " + dir.path() + " " +
                                std::to_string(at::get_num_threads()) + " 2>&1",
                            &output);
  ASSERT_EQ(rc, 0) << output;

  for (const bool x_grad : {true, false}) {
    for (auto& p : block->parameters()) p.mutable_grad() = at::Tensor();
    at::Tensor x = x0.clone().requires_grad_(x_grad);
    torch::manual_seed(123);
    at::Tensor y = ddp::checkpoint([block](const at::Tensor& h) { return block->forward(h); }, x);
    (y * y).sum().backward();
    std::vector<at::Tensor> parts{y};
    if (x_grad) parts.push_back(x.grad());
    for (const auto& p : block->parameters()) parts.push_back(p.grad());
    parts.push_back(at::rand({6}));
    const at::Tensor cpp = flat(parts);
    const at::Tensor py =
        ddp_test::read_floats(dir.file(x_grad ? "py_grad.bin" : "py_nograd.bin"), {cpp.numel()});
    const double diff = ddp_test::max_diff(cpp, py);
    const char* what = x_grad ? "input requires grad" : "no input requires grad";
    // The same kernels on the same LibTorch, with the same thread count: the same bits.
    EXPECT_TRUE(ddp_test::same_bits(cpp, py))
        << what << ": ddp::checkpoint and torch.utils.checkpoint differ by " << diff;
    // The generator after backward: the same draws, so both forked it the same way.
    EXPECT_TRUE(ddp_test::same_bits(cpp.slice(0, -6), py.slice(0, -6))) << what;
    // A parameter gradient that dropout's mask shapes, and not zero.
    EXPECT_GT(block->fc1->weight.grad().abs().max().item<double>(), 0.0) << what;
    std::printf("ddp::checkpoint vs torch.utils.checkpoint (%s): max |difference| %.3g\n", what,
                diff);
  }
}

}  // namespace

}  // namespace activation_checkpoint_python_test
