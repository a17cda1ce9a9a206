#pragma once

// The zip container of torch.save / torch::pickle_save files, read with checks.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddp {
namespace detail {

struct ZipRecord {
  std::string name;     // e.g. "archive/data.pkl"
  uint64_t offset = 0;  // of the record's bytes in the file
  uint64_t size = 0;
};

/// The records of a complete zip archive whose every record matches the CRC-32 the
/// archive recorded for it. Throws, naming `where` and what is wrong, for a truncated or
/// corrupt file. See Note [Integrity check].
std::vector<ZipRecord> read_zip(std::string_view bytes, const std::string& where);

/// A zip archive of stored (uncompressed) records, as LibTorch's reader reads them.
std::string write_zip(const std::vector<std::pair<std::string, std::string_view>>& records);

}  // namespace detail
}  // namespace ddp
