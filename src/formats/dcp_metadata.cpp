// Note [DCP metadata]
// torch.distributed.checkpoint's FileSystemWriter.finish pickles a Metadata dataclass
// (protocol 4 under Python 3.11):
//   Metadata(state_dict_metadata={key: TensorStorageMetadata(properties, size, chunks)
//                                       | BytesStorageMetadata()},
//            planner_data={key: (path parts...)},
//            storage_data={MetadataIndex(fqn, offset, index): _StorageInfo(relative_path,
//                                                                          offset, length)},
//            storage_meta=StorageMeta(...), version="1.0.0")
// Dataclasses pickle as NEWOBJ of the class with no arguments, then BUILD with their
// __dict__. TensorProperties has __getstate__: a tuple (dtype, layout, requires_grad,
// memory format encoding, pin_memory[, strides since 2.6]), its dtype a global
// (torch.float32), its layout torch.serialization._get_layout("torch.strided"), its memory
// format getattr(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT"). torch.Size is
// REDUCE(torch.Size, (tuple,)). Before 2.4, TensorProperties lived in
// torch.distributed._shard.sharded_tensor.metadata; both names are read.
//
// The file comes from disk, so it is read with py::read and an allowlist of exactly these
// classes: nothing is executed, and a pickle naming anything else is refused. We write
// the 5-tuple form of TensorProperties, which every version's __setstate__ takes, and no
// StorageMeta (its fields are optional).

#include "formats/dcp_metadata.h"

#include "formats/py_pickle.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

namespace ddp {
namespace detail {
namespace dcp {
namespace {

namespace py = ::ddp::detail::py;

constexpr const char* kMeta = "torch.distributed.checkpoint.metadata";
constexpr const char* kOldMeta = "torch.distributed._shard.sharded_tensor.metadata";
constexpr const char* kFs = "torch.distributed.checkpoint.filesystem";

struct DtypeName {
  c10::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {c10::ScalarType::Float, "float32"},
    {c10::ScalarType::Double, "float64"},
    {c10::ScalarType::Half, "float16"},
    {c10::ScalarType::BFloat16, "bfloat16"},
    {c10::ScalarType::Byte, "uint8"},
    {c10::ScalarType::Char, "int8"},
    {c10::ScalarType::Short, "int16"},
    {c10::ScalarType::Int, "int32"},
    {c10::ScalarType::Long, "int64"},
    {c10::ScalarType::Bool, "bool"},
    {c10::ScalarType::ComplexFloat, "complex64"},
    {c10::ScalarType::ComplexDouble, "complex128"},
};

bool allowed(const std::string& module, const std::string& name) {
  static const std::set<std::string> meta = {
      "Metadata",         "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
      "TensorProperties", "MetadataIndex",         "StorageMeta",          "_MEM_FORMAT_ENCODING"};
  if (module == kMeta) return meta.count(name) > 0;
  if (module == kOldMeta) return name == "TensorProperties" || name == "MEM_FORMAT_ENCODING";
  if (module == kFs) return name == "_StorageInfo";
  if (module == "torch") {
    if (name == "Size") return true;
    for (const auto& d : kDtypes) {
      if (name == d.name) return true;
    }
    return false;
  }
  if (module == "torch.serialization") return name == "_get_layout";
  if (module == "builtins") return name == "getattr";
  if (module == "pathlib") return name == "PosixPath" || name == "WindowsPath" || name == "Path";
  if (module == "collections") return name == "OrderedDict";
  return false;
}

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}

bool is_object_of(const py::Value& v, const char* module, const char* name) {
  return (v.kind == py::Kind::kObject || v.kind == py::Kind::kCall) && v.callable &&
         v.callable->kind == py::Kind::kGlobal && v.callable->module == module &&
         v.callable->name == name;
}

// An object's BUILD state as a dict ({} when it had none).
const py::Value& state_dict_of(const py::Value& v, const std::string& what,
                               const std::string& where) {
  static const py::Value empty = [] {
    py::Value d;
    d.kind = py::Kind::kDict;
    return d;
  }();
  if (!v.state) return empty;
  if (v.state->kind != py::Kind::kDict) {
    fail(where, what + " has a state of type " + py::describe(*v.state) + ", not a dict");
  }
  return *v.state;
}

int64_t as_int(const py::ValuePtr& v, const std::string& what, const std::string& where) {
  if (!v || v->kind != py::Kind::kInt) {
    fail(where, what + " should be an int, but it is " + (v ? py::describe(*v) : "missing"));
  }
  return v->i;
}

std::string as_str(const py::ValuePtr& v, const std::string& what, const std::string& where) {
  if (!v || v->kind != py::Kind::kStr) {
    fail(where, what + " should be a str, but it is " + (v ? py::describe(*v) : "missing"));
  }
  return v->s;
}

// torch.Size(...) (or a plain tuple or list of ints) as a vector.
std::vector<int64_t> as_size(const py::ValuePtr& v, const std::string& what,
                             const std::string& where) {
  if (!v) fail(where, what + " is missing");
  const py::Value* seq = v.get();
  if (is_object_of(*v, "torch", "Size")) {
    if (v->items.size() != 1) fail(where, what + ": torch.Size takes one tuple");
    seq = v->items[0].get();
  }
  if (seq->kind != py::Kind::kTuple && seq->kind != py::Kind::kList) {
    fail(where, what + " should be a torch.Size, but it is " + py::describe(*v));
  }
  std::vector<int64_t> out;
  for (const auto& item : seq->items) {
    const int64_t n = as_int(item, what + "'s element", where);
    out.push_back(n);
  }
  return out;
}

c10::ScalarType dtype_of(const py::ValuePtr& v, const std::string& what, const std::string& where) {
  if (v && v->kind == py::Kind::kGlobal && v->module == "torch") {
    for (const auto& d : kDtypes) {
      if (v->name == d.name) return d.type;
    }
  }
  fail(where, what + " should be a torch dtype, but it is " + (v ? py::describe(*v) : "missing"));
}

py::ValuePtr size_value(const std::vector<int64_t>& sizes) {
  std::vector<py::ValuePtr> items;
  for (int64_t s : sizes) items.push_back(py::integer(s));
  return py::call(py::global("torch", "Size"), {py::tuple(std::move(items))});
}

py::ValuePtr path_value(const std::vector<PathPart>& path) {
  std::vector<py::ValuePtr> parts;
  for (const auto& p : path) parts.push_back(p.index ? py::integer(*p.index) : py::str(p.name));
  return py::tuple(std::move(parts));
}

}  // namespace

std::string dtype_name(c10::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.type == dtype) return d.name;
  }
  throw std::runtime_error(std::string("a DCP checkpoint cannot hold tensors of dtype ") +
                           c10::toString(dtype));
}

std::string key_of(const std::vector<PathPart>& path) {
  std::string key;
  for (size_t i = 0; i < path.size(); ++i) {
    if (i) key += '.';
    key += path[i].index ? std::to_string(*path[i].index) : path[i].name;
  }
  return key;
}

std::string write_metadata(const Metadata& meta) {
  std::vector<std::pair<py::ValuePtr, py::ValuePtr>> entries, planner, storage;
  const auto cls = [](const char* module, const char* name) { return py::global(module, name); };
  for (const std::string& key : meta.keys) {
    const Entry& e = meta.entries.at(key);
    py::ValuePtr value;
    if (e.is_tensor) {
      py::ValuePtr properties = py::object(
          cls(kMeta, "TensorProperties"), {},
          py::tuple(
              {py::global("torch", dtype_name(e.dtype)),
               py::call(cls("torch.serialization", "_get_layout"), {py::str("torch.strided")}),
               py::boolean(e.requires_grad),
               py::call(cls("builtins", "getattr"),
                        {cls(kMeta, "_MEM_FORMAT_ENCODING"), py::str("TORCH_CONTIGUOUS_FORMAT")}),
               py::boolean(false)}));
      std::vector<py::ValuePtr> chunks;
      for (const Chunk& c : e.chunks) {
        chunks.push_back(py::object(cls(kMeta, "ChunkStorageMetadata"), {},
                                    py::dict({{py::str("offsets"), size_value(c.offsets)},
                                              {py::str("sizes"), size_value(c.sizes)}})));
      }
      value = py::object(cls(kMeta, "TensorStorageMetadata"), {},
                         py::dict({{py::str("properties"), properties},
                                   {py::str("size"), size_value(e.size)},
                                   {py::str("chunks"), py::list(std::move(chunks))}}));
      for (size_t i = 0; i < e.chunks.size(); ++i) {
        const Storage& s = e.chunk_storage[i];
        storage.emplace_back(
            py::object(cls(kMeta, "MetadataIndex"), {},
                       py::dict({{py::str("fqn"), py::str(key)},
                                 {py::str("offset"), size_value(e.chunks[i].offsets)},
                                 {py::str("index"), py::integer(static_cast<int64_t>(i))}})),
            py::object(cls(kFs, "_StorageInfo"), {},
                       py::dict({{py::str("relative_path"), py::str(s.relative_path)},
                                 {py::str("offset"), py::integer(s.offset)},
                                 {py::str("length"), py::integer(s.length)}})));
      }
    } else {
      value = py::object(cls(kMeta, "BytesStorageMetadata"), {}, nullptr);
      const Storage& s = e.object_storage;
      storage.emplace_back(py::object(cls(kMeta, "MetadataIndex"), {},
                                      py::dict({{py::str("fqn"), py::str(key)},
                                                {py::str("offset"), py::none()},
                                                {py::str("index"), py::none()}})),
                           py::object(cls(kFs, "_StorageInfo"), {},
                                      py::dict(
                                          {{py::str("relative_path"), py::str(s.relative_path)},
                                           {py::str("offset"), py::integer(s.offset)},
                                           {py::str("length"), py::integer(s.length)}})));
    }
    entries.emplace_back(py::str(key), value);
    std::vector<PathPart> path = e.path;
    if (path.empty()) path.push_back(PathPart{key, std::nullopt});
    planner.emplace_back(py::str(key), path_value(path));
  }
  return py::write(py::object(
      cls(kMeta, "Metadata"), {},
      py::dict({{py::str("state_dict_metadata"), py::dict(std::move(entries))},
                {py::str("planner_data"), py::dict(std::move(planner))},
                {py::str("storage_data"), py::dict(std::move(storage))},
                {py::str("storage_meta"), py::none()},
                {py::str("version"), py::str(meta.version.empty() ? "1.0.0" : meta.version)}})));
}

Metadata read_metadata(std::string_view bytes, const std::string& where) {
  const py::ValuePtr root = py::read(bytes, allowed, where);
  // Note [Work bounded by the file]: a pickle may refer to one tuple or object many times
  // through its memo, so a few bytes can stand for many chunks. Expanding them costs work
  // and memory in proportion; the total is bounded by the file's size (a real file spells
  // each chunk out in more bytes than it costs here).
  int64_t budget = 4 * static_cast<int64_t>(bytes.size()) + 65536;
  auto spend = [&](int64_t units) {
    budget -= units;
    if (budget < 0) {
      fail(where, "the metadata describes more chunks and storage than its " +
                      std::to_string(bytes.size()) +
                      " bytes can hold without sharing them (a pickle that refers to the same "
                      "entries again and again): damaged or hostile; refusing it");
    }
  };
  if (!is_object_of(*root, kMeta, "Metadata")) {
    fail(where, "the pickle holds " + py::describe(*root) +
                    ", not torch.distributed.checkpoint.metadata.Metadata");
  }
  const py::Value& fields = state_dict_of(*root, "Metadata", where);
  Metadata meta;
  if (const auto v = py::find(fields, "version"); v && v->kind == py::Kind::kStr)
    meta.version = v->s;

  const py::ValuePtr sdm = py::find(fields, "state_dict_metadata");
  if (!sdm || sdm->kind != py::Kind::kDict) {
    fail(where, "Metadata.state_dict_metadata should be a dict, but it is " +
                    (sdm ? py::describe(*sdm) : std::string("missing")));
  }
  for (const auto& [k, v] : sdm->dict) {
    const std::string key = as_str(k, "a key of state_dict_metadata", where);
    const std::string what = "key '" + key + "'";
    if (meta.entries.count(key)) fail(where, what + " appears twice");
    Entry e;
    if (is_object_of(*v, kMeta, "BytesStorageMetadata")) {
      e.is_tensor = false;
    } else if (is_object_of(*v, kMeta, "TensorStorageMetadata")) {
      e.is_tensor = true;
      const py::Value& f = state_dict_of(*v, what, where);
      const py::ValuePtr props = py::find(f, "properties");
      if (!props || !(is_object_of(*props, kMeta, "TensorProperties") ||
                      is_object_of(*props, kOldMeta, "TensorProperties"))) {
        fail(where, what + ": properties should be a TensorProperties, but it is " +
                        (props ? py::describe(*props) : std::string("missing")));
      }
      if (props->state && props->state->kind == py::Kind::kTuple) {
        const auto& t = props->state->items;
        if (t.size() < 5) fail(where, what + ": TensorProperties' state has fewer than 5 fields");
        e.dtype = dtype_of(t[0], what + "'s dtype", where);
        if (t[2] && t[2]->kind == py::Kind::kBool) e.requires_grad = t[2]->b;
      } else if (props->state && props->state->kind == py::Kind::kDict) {
        e.dtype = dtype_of(py::find(*props->state, "dtype"), what + "'s dtype", where);
      } else {
        fail(where, what + ": TensorProperties has no state");
      }
      e.size = as_size(py::find(f, "size"), what + "'s size", where);
      for (int64_t s : e.size) {
        if (s < 0) fail(where, what + " has a negative size");
      }
      const py::ValuePtr chunks = py::find(f, "chunks");
      if (!chunks || chunks->kind != py::Kind::kList) {
        fail(where, what + ": chunks should be a list");
      }
      for (const auto& c : chunks->items) {
        if (!c || !is_object_of(*c, kMeta, "ChunkStorageMetadata")) {
          fail(where, what + ": a chunk is " + (c ? py::describe(*c) : std::string("missing")) +
                          ", not a ChunkStorageMetadata");
        }
        spend(1 + 2 * static_cast<int64_t>(e.size.size()));
        const py::Value& cf = state_dict_of(*c, what + "'s chunk", where);
        Chunk chunk{as_size(py::find(cf, "offsets"), what + "'s chunk offsets", where),
                    as_size(py::find(cf, "sizes"), what + "'s chunk sizes", where)};
        if (chunk.offsets.size() != e.size.size() || chunk.sizes.size() != e.size.size()) {
          fail(where, what + " has " + std::to_string(e.size.size()) +
                          " dimensions, but a chunk has offsets or sizes of another length");
        }
        for (size_t d = 0; d < e.size.size(); ++d) {
          if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 ||
              chunk.offsets[d] > e.size[d] - chunk.sizes[d]) {
            fail(where, what + " has a chunk that reaches outside the tensor in dimension " +
                            std::to_string(d));
          }
        }
        e.chunks.push_back(std::move(chunk));
      }
      e.chunk_storage.resize(e.chunks.size(), Storage{"", -1, -1});
    } else {
      fail(where, what + " is described by " + py::describe(*v) +
                      ", not TensorStorageMetadata or BytesStorageMetadata");
    }
    meta.keys.push_back(key);
    meta.entries.emplace(key, std::move(e));
  }

  if (const py::ValuePtr planner = py::find(fields, "planner_data");
      planner && planner->kind == py::Kind::kDict) {
    for (const auto& [k, v] : planner->dict) {
      if (!k || k->kind != py::Kind::kStr) continue;
      auto it = meta.entries.find(k->s);
      if (it == meta.entries.end() || !v || v->kind != py::Kind::kTuple) continue;
      std::vector<PathPart> path;
      for (const auto& p : v->items) {
        if (p && p->kind == py::Kind::kStr) {
          path.push_back(PathPart{p->s, std::nullopt});
        } else if (p && p->kind == py::Kind::kInt) {
          path.push_back(PathPart{std::to_string(p->i), p->i});
        } else {
          fail(where, "planner_data of key '" + k->s + "' holds a " +
                          (p ? py::describe(*p) : std::string("missing value")) +
                          ", not a str or an int");
        }
      }
      it->second.path = std::move(path);
    }
  }

  const py::ValuePtr storage = py::find(fields, "storage_data");
  if (!storage || storage->kind != py::Kind::kDict) {
    fail(where, "Metadata.storage_data should be a dict, but it is " +
                    (storage ? py::describe(*storage) : std::string("missing")));
  }
  std::map<std::string, std::map<std::vector<int64_t>, std::vector<size_t>>> chunk_index;
  for (const auto& [k, v] : storage->dict) {
    if (!k || !is_object_of(*k, kMeta, "MetadataIndex")) {
      fail(where, "a key of storage_data is " + (k ? py::describe(*k) : std::string("missing")) +
                      ", not a MetadataIndex");
    }
    const py::Value& kf = state_dict_of(*k, "MetadataIndex", where);
    const std::string fqn = as_str(py::find(kf, "fqn"), "MetadataIndex.fqn", where);
    auto it = meta.entries.find(fqn);
    if (it == meta.entries.end()) {
      fail(where, "storage_data names key '" + fqn + "', which state_dict_metadata does not hold");
    }
    Entry& e = it->second;
    if (!v || !is_object_of(*v, kFs, "_StorageInfo")) {
      fail(where, "the storage of key '" + fqn + "' is " +
                      (v ? py::describe(*v) : std::string("missing")) + ", not a _StorageInfo");
    }
    const py::Value& vf = state_dict_of(*v, "_StorageInfo", where);
    if (const auto t = py::find(vf, "transform_descriptors");
        t && t->kind != py::Kind::kNone && !(t->kind == py::Kind::kList && t->items.empty()) &&
        !(t->kind == py::Kind::kTuple && t->items.empty())) {
      fail(where, "key '" + fqn +
                      "' was saved through storage transforms (compression or another "
                      "extension), which this reader does not undo");
    }
    Storage s{as_str(py::find(vf, "relative_path"), "_StorageInfo.relative_path", where),
              as_int(py::find(vf, "offset"), "_StorageInfo.offset", where),
              as_int(py::find(vf, "length"), "_StorageInfo.length", where)};
    spend(1 + static_cast<int64_t>(fqn.size() + s.relative_path.size()));
    if (s.offset < 0 || s.length < 0) {
      fail(where, "key '" + fqn + "' has a negative offset or length in its storage");
    }
    if (!e.is_tensor) {
      e.object_storage = s;
      continue;
    }
    const py::ValuePtr off = py::find(kf, "offset");
    if (!off || off->kind == py::Kind::kNone) {
      fail(where, "the storage of tensor key '" + fqn + "' gives no chunk offset");
    }
    const std::vector<int64_t> offsets = as_size(off, "MetadataIndex.offset", where);
    spend(1 + static_cast<int64_t>(offsets.size()));
    // The chunks of each key by their offsets, made once (not a scan per storage entry).
    auto& index = chunk_index[fqn];
    if (index.empty()) {
      for (size_t i = 0; i < e.chunks.size(); ++i) index[e.chunks[i].offsets].push_back(i);
    }
    size_t found = e.chunks.size();
    if (const auto at = index.find(offsets); at != index.end()) {
      for (size_t i : at->second) {
        if (e.chunk_storage[i].offset < 0) {
          found = i;
          break;
        }
      }
    }
    if (found == e.chunks.size()) {
      fail(where, "storage_data names a chunk of key '" + fqn + "' at offsets its metadata lacks");
    }
    e.chunk_storage[found] = s;
  }
  for (const auto& [key, e] : meta.entries) {
    if (!e.is_tensor) {
      if (e.object_storage.relative_path.empty()) {
        fail(where, "key '" + key + "' has no storage entry");
      }
      continue;
    }
    for (const Storage& s : e.chunk_storage) {
      if (s.offset < 0) fail(where, "a chunk of key '" + key + "' has no storage entry");
    }
  }
  return meta;
}

}  // namespace dcp
}  // namespace detail
}  // namespace ddp
