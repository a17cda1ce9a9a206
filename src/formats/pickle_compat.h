#pragma once

// Python pickles that older LibTorch unpicklers cannot read. See Note [Python pickles].

#include <ATen/core/ivalue.h>

#include <optional>
#include <string>
#include <string_view>

namespace ddp {
namespace detail {

/// The key under which a rewritten pickle keeps an object's BUILD state in its dict.
constexpr const char* kBuildStateKey = "__ddp_cpp_build_state__";

/// `pickle` (the data.pkl of a torch.save file) rewritten so that LibTorch's unpickler
/// reads it, or nullopt when it needs no change or cannot be rewritten (then the
/// unpickler reports its own error).
std::optional<std::string> rewrite_python_pickle(std::string_view pickle);

/// Removes the kBuildStateKey entries that rewrite_python_pickle introduced.
void drop_build_states(const c10::IValue& value);

}  // namespace detail
}  // namespace ddp
