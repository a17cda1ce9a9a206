#include "distributed/shm/shm_layout.h"

#include "distributed/shm/shm_transport.h"

#include <cstddef>

namespace ddp {
namespace detail {
namespace shm {

size_t segment_bytes(const Options& o) {
  return data_offset(o.world_size) +
         2 * (static_cast<size_t>(o.world_size) + 1) * rounded_slice(o.slice_bytes);
}

unsigned char* Transport::input_area(int slot, int rank) const {
  const size_t n = static_cast<size_t>(options_.world_size);
  return static_cast<unsigned char*>(base_) + data_offset(options_.world_size) +
         (static_cast<size_t>(slot) * (n + 1) + static_cast<size_t>(rank)) * options_.slice_bytes;
}

unsigned char* Transport::result_area(int slot) const {
  return input_area(slot, options_.world_size);
}

}  // namespace shm
}  // namespace detail
}  // namespace ddp
