#pragma once

// Construction-time check that every rank wraps the same model with the same options.
// Each rank describes its model as text, the descriptions are all-gathered, and every
// rank compares all of them with rank 0's, so all ranks reach the same verdict and
// raise the same MismatchError.

#include <ddp/distributed/process_group.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace ddp {
namespace detail {

struct ModelDescription {
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  /// (option name, value as text): options that must agree across ranks.
  std::vector<std::pair<std::string, std::string>> options;
};

/// Throws MismatchError (every rank) naming the first difference and the ranks that
/// differ from rank 0; TimeoutError if a rank does not take part within the group's
/// timeout.
void verify_model_across_ranks(ProcessGroup& pg, const ModelDescription& model);

/// Debug mode, every few iterations: the parameters' values are the same on every rank
/// (a float64 sum per parameter, compared with rank 0's). Throws MismatchError on every
/// rank naming the first parameter that diverged and the rank it diverged on.
void verify_parameters_agree(ProcessGroup& pg,
                             const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                             int64_t iteration);

/// The text one rank contributes (exposed for tests).
std::string describe_model(const ModelDescription& model);

/// Compares descriptions (index = rank); returns "" when all agree, else the message.
std::string compare_descriptions(const std::vector<std::string>& per_rank);

}  // namespace detail
}  // namespace ddp
