// Fuzz target: the zip reader and writer of torch.save files, src/formats/zip_archive.{h,cpp}
// (libc10 only: its refusals are c10::Error).
//
// A refusal must be a c10::Error whose message names `where`. What read_zip accepts must
// describe records inside the input with distinct names, and must survive a round trip:
// write_zip of those records' bytes is read back to the same names and bytes.
#include "formats/zip_archive.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz_check.h"

namespace {

const char kWhere[] = "fuzz input";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::vector<ddp::detail::ZipRecord> records;
  try {
    records = ddp::detail::read_zip(bytes, kWhere);
  } catch (const c10::Error& e) {
    ddp_fuzz::expect_names_file(e, kWhere);
    return 0;
  }
  std::vector<std::pair<std::string, std::string_view>> parts;
  std::set<std::string> names;
  for (const auto& r : records) {
    FUZZ_CHECK(r.offset <= size && r.size <= size - r.offset,
               "record '" + ddp_fuzz::escaped(r.name) + "' lies outside the input");
    FUZZ_CHECK(names.insert(r.name).second,
               "two records named '" + ddp_fuzz::escaped(r.name) + "'");
    parts.emplace_back(r.name, bytes.substr(r.offset, r.size));
  }
  const std::string written = ddp::detail::write_zip(parts);
  std::vector<ddp::detail::ZipRecord> again;
  try {
    again = ddp::detail::read_zip(written, "rewritten");
  } catch (const c10::Error& e) {
    FUZZ_CHECK(false, std::string("write_zip's archive was refused: ") + e.what());
  }
  FUZZ_CHECK(again.size() == records.size(), "the round trip changed the number of records");
  for (size_t i = 0; i < again.size(); ++i) {
    FUZZ_CHECK(again[i].name == parts[i].first,
               "the round trip renamed record " + std::to_string(i));
    FUZZ_CHECK(std::string_view(written).substr(again[i].offset, again[i].size) == parts[i].second,
               "the round trip changed record '" + ddp_fuzz::escaped(parts[i].first) + "'");
  }
  return 0;
}
