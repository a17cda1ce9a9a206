// Fuzz target: the restricted pickle reader, src/formats/py_pickle.{h,cpp}.
//
// Each input is read four times:
//  1. with the allowlist of the pickle tests (DCP's classes and a few of Python's), the
//     default limits;
//  2. with every global allowed (so that REDUCE, NEWOBJ and BUILD are reached without
//     guessing names);
//  3. with an empty allowlist (no global at all);
//  4. with the DCP allowlist and tight limits (max_depth 4, max_items 48).
// Any failure must be a std::runtime_error whose message starts with `where` + ": ". What
// reads must respect the limits (depth, distinct values), and, for 1 and 2, survive a
// round trip: py::write must take it (it never throws on a tree the reader made), the
// written pickle must read back to the same tree, and writing that again must give the
// same bytes.
#include "formats/py_pickle.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "fuzz_check.h"

namespace py = ddp::detail::py;

namespace {

// tests/formats_light/py_pickle_test.cpp's dcp_allowed, with all of DCP's dtypes.
bool dcp_allowed(const std::string& module, const std::string& name) {
  static const std::set<std::pair<std::string, std::string>> names = {
      {"torch.distributed.checkpoint.metadata", "Metadata"},
      {"torch.distributed.checkpoint.metadata", "TensorStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "BytesStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "TensorProperties"},
      {"torch.distributed.checkpoint.metadata", "MetadataIndex"},
      {"torch.distributed.checkpoint.metadata", "StorageMeta"},
      {"torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"},
      {"torch.distributed.checkpoint.filesystem", "_StorageInfo"},
      {"torch", "Size"},
      {"torch", "float32"},
      {"torch", "float64"},
      {"torch", "bfloat16"},
      {"torch", "int64"},
      {"torch.serialization", "_get_layout"},
      {"builtins", "getattr"},
      {"builtins", "set"},
      {"builtins", "frozenset"},
      {"builtins", "bytearray"},
      {"pathlib", "PosixPath"},
      {"collections", "OrderedDict"},
      {"__main__", "Point"},
      {"copyreg", "_reconstructor"},
      {"builtins", "object"},
      {"_codecs", "encode"},
  };
  return names.count({module, name}) > 0;
}

bool any_allowed(const std::string&, const std::string&) { return true; }

// Structural equality of two trees (DAGs: a pair is compared once).
struct Same {
  std::set<std::pair<const py::Value*, const py::Value*>> seen;

  bool operator()(const py::ValuePtr& a, const py::ValuePtr& b) {
    if (!a || !b) return !a && !b;
    if (!seen.insert({a.get(), b.get()}).second) return true;
    if (a->kind != b->kind || a->b != b->b || a->i != b->i ||
        std::memcmp(&a->f, &b->f, sizeof a->f) != 0 || a->s != b->s || a->module != b->module ||
        a->name != b->name || a->items.size() != b->items.size() ||
        a->dict.size() != b->dict.size()) {
      return false;
    }
    for (size_t k = 0; k < a->items.size(); ++k)
      if (!(*this)(a->items[k], b->items[k])) return false;
    for (size_t k = 0; k < a->dict.size(); ++k) {
      if (!(*this)(a->dict[k].first, b->dict[k].first)) return false;
      if (!(*this)(a->dict[k].second, b->dict[k].second)) return false;
    }
    return (*this)(a->callable, b->callable) && (*this)(a->state, b->state);
  }
};

// The reader's depth (0 for a scalar, 1 + the deepest child for a container or an object)
// and the number of distinct values, over the DAG.
struct Measure {
  std::map<const py::Value*, size_t> depth_of;

  size_t depth(const py::ValuePtr& v) {
    if (!v) return 0;
    if (auto it = depth_of.find(v.get()); it != depth_of.end()) return it->second;
    const bool container = v->kind == py::Kind::kTuple || v->kind == py::Kind::kList ||
                           v->kind == py::Kind::kDict || v->kind == py::Kind::kObject ||
                           v->kind == py::Kind::kCall;
    size_t d = container ? 1 : 0;
    auto child = [&](const py::ValuePtr& c) {
      if (c) d = std::max(d, depth(c) + 1);
    };
    for (const auto& item : v->items) child(item);
    for (const auto& kv : v->dict) child(kv.first), child(kv.second);
    child(v->callable);
    child(v->state);
    depth_of[v.get()] = d;
    return d;
  }
};

py::ValuePtr try_read(std::string_view in, const py::Allowlist& allowed, const std::string& where,
                      const py::ReadLimits& limits) {
  try {
    return py::read(in, allowed, where, limits);
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    FUZZ_CHECK(msg.compare(0, where.size() + 2, where + ": ") == 0,
               "the message does not start with '" + where + ": ': " + ddp_fuzz::escaped(msg));
    return nullptr;
  }
}

void check_limits(const py::ValuePtr& v, const py::ReadLimits& limits) {
  Measure m;
  const size_t depth = m.depth(v);
  FUZZ_CHECK(depth <= limits.max_depth, "a tree of depth " + std::to_string(depth) +
                                            " read under max_depth " +
                                            std::to_string(limits.max_depth));
  FUZZ_CHECK(m.depth_of.size() <= limits.max_items, std::to_string(m.depth_of.size()) +
                                                        " distinct values read under max_items " +
                                                        std::to_string(limits.max_items));
}

void round_trip(const py::ValuePtr& v, const py::Allowlist& allowed) {
  // What describe() and find() do with any tree: no crash.
  (void)py::describe(*v);
  (void)py::find(*v, "state_dict_metadata");
  std::string written;
  try {
    written = py::write(v);
  } catch (const std::exception& e) {
    FUZZ_CHECK(false, std::string("py::write refused a tree that py::read made: ") + e.what());
  }
  py::ValuePtr back;
  try {
    back = py::read(written, allowed, "round trip");
  } catch (const std::exception& e) {
    FUZZ_CHECK(false, std::string("py::read refused what py::write wrote: ") + e.what() +
                          "\n  written: " + ddp_fuzz::escaped(written, 400));
  }
  FUZZ_CHECK(Same()(v, back), "the written pickle reads back as another tree\n  written: " +
                                  ddp_fuzz::escaped(written, 400));
  FUZZ_CHECK(py::write(back) == written, "writing the tree read back gives other bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const py::ReadLimits defaults;

  if (py::ValuePtr v = try_read(in, dcp_allowed, "dcp", defaults)) {
    check_limits(v, defaults);
    round_trip(v, dcp_allowed);
  }
  if (py::ValuePtr v = try_read(in, any_allowed, "any", defaults)) {
    check_limits(v, defaults);
    round_trip(v, any_allowed);
  }
  if (py::ValuePtr v = try_read(in, py::Allowlist(), "none", defaults)) check_limits(v, defaults);

  py::ReadLimits tight;
  tight.max_depth = 4;
  tight.max_items = 48;
  if (py::ValuePtr v = try_read(in, dcp_allowed, "tight", tight)) check_limits(v, tight);
  return 0;
}
