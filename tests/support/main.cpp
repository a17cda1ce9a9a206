// Test main: a child started by run_processes runs its scenario instead of the tests.
#include "support/harness.h"

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  int code = 0;
  if (ddp_test::maybe_run_scenario(&code)) return code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
