#pragma once

// LibTorch 1.13 / 2.x differences outside c10d (c10d's are in c10d_comm.cpp). Each is
// written so that one source compiles against both, without testing a version number;
// docs/libtorch.md lists them.

#include <torch/csrc/autograd/variable.h>

#include <utility>

namespace ddp {
namespace detail {

/// An owning pointer to an autograd Node: std::shared_ptr in 1.13, c10::intrusive_ptr
/// from 2.10 on. Both have get(), operator-> and operator bool.
using NodePtr = decltype(torch::autograd::impl::grad_accumulator(
    std::declval<const torch::autograd::Variable&>()));

}  // namespace detail
}  // namespace ddp
