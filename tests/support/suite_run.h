#pragma once

#include "support/harness.h"

#include <memory>  // the fixtures hold a SuiteRun in a std::unique_ptr
#include <string>

namespace ddp_test {

/// What a test suite computes once, before its first case, for all of them: typically
/// one Python run that takes every case, since Python's start-up (torch's import) is most
/// of a run. A fixture holds one in a static unique_ptr, made in SetUpTestSuite and reset
/// in TearDownTestSuite: a folder of its own, and the command's output and exit code.
struct SuiteRun {
  TempDir dir;
  std::string output;
  int rc = 0;
};

}  // namespace ddp_test
