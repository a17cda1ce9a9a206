#pragma once

// The `.metadata` file of PyTorch's Distributed Checkpoint (torch.distributed.checkpoint,
// DCP): a Python pickle of torch.distributed.checkpoint.metadata.Metadata, read with the
// restricted reader of py_pickle.h (Note [DCP metadata]) and written in the shape that
// Python's FileSystemWriter writes.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp {
namespace detail {
namespace dcp {

/// One part of a key's path in the nested state dict it was flattened from (planner_data):
/// a dict key, or a list index.
struct PathPart {
  std::string name;
  std::optional<int64_t> index;  // set for a list index
};

/// A block of a tensor: [offsets, offsets + sizes) in each dimension.
struct Chunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

/// Where an item's bytes are: a torch.save archive (a tensor chunk, or a pickled object)
/// at [offset, offset + length) of relative_path.
struct Storage {
  std::string relative_path;
  int64_t offset = 0;
  int64_t length = 0;
};

/// A key of the checkpoint: a tensor (its dtype, full size and the saved chunks, each with
/// its storage), or an object (BytesStorageMetadata).
struct Entry {
  bool is_tensor = false;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool requires_grad = false;
  std::vector<int64_t> size;
  std::vector<Chunk> chunks;
  std::vector<Storage> chunk_storage;  // one per chunk
  Storage object_storage;              // an object's
  std::vector<PathPart> path;          // planner_data: where it sat before flattening
};

struct Metadata {
  std::vector<std::string> keys;  // in the file's order
  std::map<std::string, Entry> entries;
  std::string version;
};

/// The pickle of `meta`, as FileSystemWriter.finish writes it (Python's dcp.load reads it).
std::string write_metadata(const Metadata& meta);

/// Parses a `.metadata` file's bytes. Accepts only the classes DCP writes; refuses
/// anything else, and any inconsistency (a chunk outside its tensor, a storage entry for
/// no key, a key without storage), with `where` and the key in the message.
Metadata read_metadata(std::string_view bytes, const std::string& where);

/// "float32" for kFloat: torch's attribute name of a dtype; throws for one DCP cannot name.
std::string dtype_name(c10::ScalarType dtype);

/// The key that flatten_state_dict makes of `path`: its parts joined by '.'.
std::string key_of(const std::vector<PathPart>& path);

}  // namespace dcp
}  // namespace detail
}  // namespace ddp
