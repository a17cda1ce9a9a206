// Fuzz target: the DCP `.metadata` reader and writer, src/formats/dcp_metadata.{h,cpp}
// (on top of py_pickle; c10/core/ScalarType.h only for the dtype enum, no libc10).
//
// A refusal must be a std::runtime_error whose message starts with `where` + ": ". What
// read_metadata accepts must be consistent (every key has an entry, every tensor chunk
// lies inside its tensor and has a storage entry, every object key has a storage entry),
// and must survive a round trip: write_metadata takes it, read_metadata reads the written
// bytes back to the same Metadata, and writing that gives the same bytes. Two differences
// are by design (dcp_metadata.cpp's writer fills them in): an empty planner path is
// written as the key alone, and an empty version as "1.0.0".
#include "formats/dcp_metadata.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fuzz_check.h"

namespace dcp = ddp::detail::dcp;

namespace {

dcp::Metadata normalized(dcp::Metadata m) {
  if (m.version.empty()) m.version = "1.0.0";
  for (auto& [key, e] : m.entries) {
    if (e.path.empty()) e.path.push_back(dcp::PathPart{key, std::nullopt});
  }
  return m;
}

bool same(const dcp::Storage& a, const dcp::Storage& b) {
  return a.relative_path == b.relative_path && a.offset == b.offset && a.length == b.length;
}

// Where two Metadata differ, or "" when they do not.
std::string difference(const dcp::Metadata& a, const dcp::Metadata& b) {
  if (a.keys != b.keys) return "keys";
  if (a.version != b.version) return "version";
  if (a.entries.size() != b.entries.size()) return "number of entries";
  for (const auto& [key, x] : a.entries) {
    auto it = b.entries.find(key);
    if (it == b.entries.end()) return "entry '" + key + "' is missing";
    const dcp::Entry& y = it->second;
    const std::string what = "entry '" + key + "': ";
    if (x.is_tensor != y.is_tensor) return what + "is_tensor";
    if (x.is_tensor) {
      if (x.dtype != y.dtype) return what + "dtype";
      if (x.requires_grad != y.requires_grad) return what + "requires_grad";
      if (x.size != y.size) return what + "size";
      if (x.chunks.size() != y.chunks.size()) return what + "number of chunks";
      for (size_t i = 0; i < x.chunks.size(); ++i) {
        if (x.chunks[i].offsets != y.chunks[i].offsets || x.chunks[i].sizes != y.chunks[i].sizes)
          return what + "chunk " + std::to_string(i);
      }
      if (x.chunk_storage.size() != y.chunk_storage.size()) return what + "chunk storage count";
      for (size_t i = 0; i < x.chunk_storage.size(); ++i) {
        if (!same(x.chunk_storage[i], y.chunk_storage[i]))
          return what + "storage of chunk " + std::to_string(i);
      }
    } else if (!same(x.object_storage, y.object_storage)) {
      return what + "object storage";
    }
    if (x.path.size() != y.path.size()) return what + "path length";
    for (size_t i = 0; i < x.path.size(); ++i) {
      if (x.path[i].name != y.path[i].name || x.path[i].index != y.path[i].index)
        return what + "path part " + std::to_string(i);
    }
  }
  return "";
}

void check_consistent(const dcp::Metadata& m) {
  FUZZ_CHECK(m.keys.size() == m.entries.size(), "keys and entries differ in number");
  for (const std::string& key : m.keys) {
    auto it = m.entries.find(key);
    FUZZ_CHECK(it != m.entries.end(), "key '" + key + "' has no entry");
    const dcp::Entry& e = it->second;
    (void)dcp::key_of(e.path);
    if (!e.is_tensor) {
      FUZZ_CHECK(!e.object_storage.relative_path.empty(), "object key without storage");
      FUZZ_CHECK(e.object_storage.offset >= 0 && e.object_storage.length >= 0,
                 "object storage with a negative offset or length");
      continue;
    }
    (void)dcp::dtype_name(e.dtype);
    FUZZ_CHECK(e.chunk_storage.size() == e.chunks.size(), "chunks and their storage differ");
    for (int64_t s : e.size) FUZZ_CHECK(s >= 0, "a negative size");
    for (size_t i = 0; i < e.chunks.size(); ++i) {
      const dcp::Chunk& c = e.chunks[i];
      FUZZ_CHECK(c.offsets.size() == e.size.size() && c.sizes.size() == e.size.size(),
                 "a chunk of another rank than its tensor");
      for (size_t d = 0; d < e.size.size(); ++d) {
        FUZZ_CHECK(c.offsets[d] >= 0 && c.sizes[d] >= 0 && c.offsets[d] <= e.size[d] &&
                       c.sizes[d] <= e.size[d] - c.offsets[d],
                   "a chunk outside its tensor in key '" + key + "'");
      }
      const dcp::Storage& s = e.chunk_storage[i];
      FUZZ_CHECK(s.offset >= 0 && s.length >= 0, "a chunk without storage in key '" + key + "'");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::string where = "fuzz/.metadata";
  dcp::Metadata m;
  try {
    m = dcp::read_metadata(in, where);
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    FUZZ_CHECK(msg.compare(0, where.size() + 2, where + ": ") == 0,
               "the message does not start with '" + where + ": ': " + ddp_fuzz::escaped(msg));
    return 0;
  }
  check_consistent(m);

  std::string written;
  try {
    written = dcp::write_metadata(m);
  } catch (const std::exception& e) {
    FUZZ_CHECK(false, std::string("write_metadata refused what read_metadata read: ") + e.what());
  }
  dcp::Metadata back;
  try {
    back = dcp::read_metadata(written, "round trip");
  } catch (const std::exception& e) {
    FUZZ_CHECK(false, std::string("read_metadata refused what write_metadata wrote: ") + e.what());
  }
  const std::string diff = difference(normalized(m), back);
  FUZZ_CHECK(diff.empty(), "the written metadata reads back different: " + diff);
  FUZZ_CHECK(dcp::write_metadata(back) == written, "writing it again gives other bytes");
  return 0;
}
