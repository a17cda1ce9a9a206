#pragma once

// Checks for the examples' numeric flags whose messages say what was expected and what
// was seen ("--epochs: expected a number > 0, got 0"), instead of CLI11's range text.

#include <ddp/serialize/checkpoint.h>

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <string>

namespace examples {

inline CLI::Validator number_check(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool ok = !text.empty() && *end == '\0' && (allow_zero ? v >= 0 : v > 0);
        if (ok) return std::string();
        return std::string("expected a number ") + (allow_zero ? ">= 0" : "> 0") + ", got " + text;
      },
      allow_zero ? "NUMBER >= 0" : "NUMBER > 0");
}

/// A number > 0.
inline const CLI::Validator kPositive = number_check(false);
/// A number >= 0.
inline const CLI::Validator kNonNegative = number_check(true);

/// The --backend flag's help: the rule for an empty backend in the words of
/// InitOptions::backend's doc comment (include/ddp/distributed/options.h);
/// tests/examples checks that they agree.
inline constexpr const char* kBackendHelp =
    "gloo, nccl or shm. Empty: \"nccl\" where LibTorch has CUDA and a GPU is visible; on CPUs "
    "\"shm\" when every rank shares this host, else \"gloo\" (or \"hier\", shared memory "
    "within hosts and Gloo between them).";

/// The --checkpoint-format flag's help and meaning.
inline constexpr const char* kCheckpointFormatHelp =
    "file: one <step>.pt that rank 0 writes (torch.load reads it); dcp: a folder in "
    "PyTorch's Distributed Checkpoint format that every rank writes its shards to (dcp.load "
    "reads it). Empty: dcp when the state is sharded (--fsdp, --zero), else file. --resume "
    "reads either.";

inline ddp::CheckpointFormat checkpoint_format(const std::string& flag, bool sharded) {
  if (flag == "dcp" || (flag.empty() && sharded)) return ddp::CheckpointFormat::kDcp;
  return ddp::CheckpointFormat::kFile;
}

}  // namespace examples
