#pragma once

// Which parameters a forward's output depends on (find_unused_parameters).

#include "distributed/common/compat.h"

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace torch {
namespace autograd {
struct Node;
}  // namespace autograd
}  // namespace torch

namespace ddp {
namespace detail {

/// result[i]: whether the autograd graph reachable from `outputs` contains
/// accumulators[i], i.e. whether backward from these outputs will produce a gradient
/// for that parameter. Walks the graph once, as c10d's prepare_for_backward does.
std::vector<bool> reached_accumulators(const std::vector<at::Tensor>& outputs,
                                       const std::vector<NodePtr>& accumulators);

}  // namespace detail
}  // namespace ddp
