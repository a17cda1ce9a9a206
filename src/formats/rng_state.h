#pragma once

// This process's random number generator states.

#include "formats/pickle_io.h"

#include <string>

namespace ddp {
namespace detail {

/// {"cpu": torch.get_rng_state(), "cuda": [state per visible CUDA device]}.
c10::impl::GenericDict rng_state();

/// Checks a saved rng_state() against this process and returns the restore.
/// CUDA states are restored for the devices both runs have.
Apply prepare_rng_load(const c10::IValue& saved, const std::string& what, const std::string& where);

}  // namespace detail
}  // namespace ddp
