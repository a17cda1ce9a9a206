#pragma once

// The one owner of which backend a group gets: Note [Backend choice] in
// backend_select.cpp. Comm::create (declared in comm.h) is defined there too.

#include "distributed/comm.h"

#include <string>

namespace ddp {
namespace detail {

/// Step 1 of Note [Backend choice]: sets c.backend (and c.backend_auto) from the
/// backend the user asked for ("" to choose), throwing a clear error for an unknown
/// name or a build without NCCL. `standin`: DDP_DEVICE_STANDIN was set.
void choose_backend(const std::string& asked, bool standin, CommConfig& c);

/// Throws, naming c.rank, when c.backend needs a GPU that this process does not see.
void check_backend_device(const CommConfig& c);

}  // namespace detail
}  // namespace ddp
