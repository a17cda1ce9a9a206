// Test main: a child started by run_processes runs its scenario instead of the tests.
#include "support/fork_server.h"
#include "support/harness.h"

#include "distributed/backends/device_standin.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>

namespace {

// The first call of a vectorized math function in a process sets up its kernel. With pip
// torch 2.15 on an AVX-512 machine, when two threads make that first call at once, one of
// them can get a tanh with errors of up to 5e-5 (about 1000 ulp) from that call: seen in
// 7 of 467 fresh processes of the thread-group checkpoint tests (0 of 467 with this
// warm-up), as one rank's first forward parting from the other rank's. Plain PyTorch
// shows it too, with two Python threads. Each rank of run_threads is a thread, so every
// such first call is made here, on one thread, before any test starts one.
void warm_up_math_kernels() {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor x = at::linspace(-3, 3, 4096, at::TensorOptions().dtype(dtype));
    const at::Tensor pos = x.abs() + 1;
    const at::Tensor m = x.view({64, 64});
    (void)at::tanh(x);
    (void)at::sigmoid(x);
    (void)at::exp(x);
    (void)at::expm1(x);
    (void)at::erf(x);
    (void)at::sin(x);
    (void)at::cos(x);
    (void)at::log(pos);
    (void)at::log1p(pos);
    (void)at::sqrt(pos);
    (void)at::rsqrt(pos);
    (void)at::reciprocal(pos);
    (void)at::pow(pos, 1.5);
    (void)at::softmax(m, 1);
    (void)at::log_softmax(m, 1);
    (void)at::gelu(x);
    (void)at::addmm(m, m, m);
    (void)at::conv2d(x.view({1, 4, 32, 32}), at::ones({4, 4, 3, 3}, x.options()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int code = 0;
  if (ddp_test::maybe_run_scenario(&code)) return code;
  // Before anything else runs here: the children of run_processes are forked from this
  // state (Note [Rank processes from a fork server]).
  ddp_test::fork_server::start();
  // The autograd engine counts devices at the process's first backward: the stand-in
  // (Note [Device stand-in]) must exist before any test runs one.
  if (ddp::detail::standin_supported()) ddp::detail::enable_standin_device();
  warm_up_math_kernels();
  ::testing::InitGoogleTest(&argc, argv);
  // A temp folder of this test process's own (TMPDIR), removed when its tests end: what
  // the processes it starts leave there (a Python peer's caches, a killed launcher's log
  // folders, a child rank's files) does not outlive the test. The children inherit it.
  ddp_test::TempDir tmp;
  ::setenv("TMPDIR", tmp.path().c_str(), 1);
  code = RUN_ALL_TESTS();
  // CTest runs the instances of a parametrized test in one process (tests/CMakeLists.txt)
  // and must tell "all skipped" from "passed": it says so with this exit code.
  const auto& unit = *::testing::UnitTest::GetInstance();
  if (code == 0 && unit.successful_test_count() == 0 && unit.skipped_test_count() > 0) {
    if (const char* skip = std::getenv("DDP_TEST_ALL_SKIPPED_EXIT")) return std::atoi(skip);
  }
  return code;
}
