// Fuzz target: ddprun's command line, parse_options in tools/ddprun/options.{h,cpp}
// (CLI11), and shell_quoted, which main() runs on the same argv.
//
// The input is split at NUL bytes into the arguments after argv[0] ("ddprun"), at most
// 64 of them. parse_options must return: Options, or nullopt with exit_code 0 (--help),
// 2 (usage) or 126/127 (the program cannot be run). What it returns must hold what
// check() promises. The options' messages go nowhere (std::cout and std::cerr are
// silenced once, in LLVMFuzzerInitialize); PATH is /usr/bin:/bin and DDPRUN_PYTHON is
// unset, so that a run does not depend on the environment.
//
// ddprun's main() does not catch exceptions, so one that escapes parse_options would end
// ddprun with "terminate called ...". The brief for this target counts that as no crash
// here: it is caught, and the first one of a process is printed as
//   ddprun_options: exception escaped parse_options: ...
// which scripts/fuzz looks for in its logs and reports.
#include "options.h"
#include "sysinfo.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "fuzz_check.h"

namespace {

bool g_escaped_reported = false;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("PATH", "/usr/bin:/bin", 1);
  unsetenv("DDPRUN_PYTHON");
  unsetenv("CUDA_VISIBLE_DEVICES");
  std::cout.rdbuf(nullptr);  // badbit: every write is dropped
  std::cerr.rdbuf(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // "a\0b" is two arguments, "a\0" an "a" and an empty one, no bytes none.
  std::vector<std::string> args{"ddprun"};
  if (size > 0) args.emplace_back();
  for (size_t k = 0; k < size; ++k) {
    if (data[k] != 0) {
      args.back() += static_cast<char>(data[k]);
    } else if (args.size() > 64) {
      break;
    } else {
      args.emplace_back();
    }
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int argc = static_cast<int>(args.size());

  int exit_code = -1;
  std::optional<ddprun::Options> o;
  try {
    o = ddprun::parse_options(argc, argv.data(), exit_code);
  } catch (const std::exception& e) {
    if (!g_escaped_reported) {
      g_escaped_reported = true;
      std::string line;
      for (size_t k = 1; k < args.size(); ++k) line += (k > 1 ? " | " : "") + args[k];
      std::fprintf(stderr, "ddprun_options: exception escaped parse_options: %s\n  argv: %s\n",
                   e.what(), ddp_fuzz::escaped(line, 400).c_str());
    }
    return 0;
  }
  (void)ddprun::shell_quoted(argc, argv.data());
  if (!o) {
    FUZZ_CHECK(exit_code == 0 || exit_code == 2 || exit_code == 126 || exit_code == 127,
               "nullopt with exit code " + std::to_string(exit_code));
    return 0;
  }
  FUZZ_CHECK(!o->command.empty() && !o->program_path.empty(), "no program");
  FUZZ_CHECK(o->nproc_per_node >= 1, "nproc_per_node " + std::to_string(o->nproc_per_node));
  FUZZ_CHECK(1 <= o->min_nodes && o->min_nodes <= o->nnodes && o->nnodes <= 65536,
             "nnodes " + std::to_string(o->min_nodes) + ":" + std::to_string(o->nnodes));
  FUZZ_CHECK(0 <= o->node_rank && o->node_rank < o->nnodes,
             "node_rank " + std::to_string(o->node_rank));
  FUZZ_CHECK(0 <= o->master_port && o->master_port <= 65535, "master_port");
  FUZZ_CHECK(0 <= o->rdzv_port && o->rdzv_port <= 65535, "rdzv_port");
  FUZZ_CHECK(!o->multi_host() || (o->master_port > 0 && o->rdzv_port > 0),
             "several hosts without ports");
  FUZZ_CHECK(o->rdzv_timeout > 0 && o->monitor_interval > 0 && o->grace_period >= 0 &&
                 o->last_call_timeout >= 0 && o->close_timeout >= 0,
             "a duration out of range");
  FUZZ_CHECK(0 <= o->redirect && o->redirect <= 3 && 0 <= o->tee && o->tee <= 3, "streams");
  FUZZ_CHECK(o->max_restarts >= 0, "max_restarts");
  FUZZ_CHECK(!o->master_addr.empty(), "empty master_addr");
  FUZZ_CHECK(!o->role.empty() && o->role.find_first_of(" \t\n=") == std::string::npos, "role");
  FUZZ_CHECK(o->rdzv_backend == "static" || o->rdzv_backend == "c10d", "rdzv_backend");
  for (int r : o->local_ranks_filter) FUZZ_CHECK(0 <= r && r <= 4095, "local rank filter");
  return 0;
}
