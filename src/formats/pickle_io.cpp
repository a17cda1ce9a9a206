#include "formats/pickle_io.h"
#include "distributed/common/check.h"

#include "formats/pickle_compat.h"
#include "formats/zip_archive.h"

#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/versions.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

namespace ddp {
namespace detail {
namespace {

// Note [Weights-only pickles]
// Python's torch.load defaults to weights_only=True since PyTorch 2.6: its unpickler
// accepts dicts, lists, tuples, primitives and tensors, and refuses any other global.
// LibTorch's pickle_save tags typed containers with torch.jit._pickle.restore_type_tag
// and writes List[int], List[float], List[bool] and List[Tensor] through
// torch.jit._pickle.build_intlist and friends, all of which that unpickler refuses. So
// every container is first rewritten as an untyped one (a plain Python list or dict),
// and the Pickler is told not to tag aggregates. What remains are the globals that
// torch.save itself writes: torch._utils._rebuild_tensor_v2, the storage classes and
// collections.OrderedDict, all of which weights_only allows.
c10::IValue plain(const c10::IValue& value) {
  if (value.isList()) {
    c10::impl::GenericList out(c10::AnyType::get());
    const c10::List<c10::IValue> in = value.toList();
    out.reserve(in.size());
    for (const c10::IValue& item : in) out.push_back(plain(item));
    return out;
  }
  if (value.isGenericDict()) {
    c10::impl::GenericDict out(c10::AnyType::get(), c10::AnyType::get());
    for (const auto& entry : value.toGenericDict()) {
      out.insert(plain(entry.key()), plain(entry.value()));
    }
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& item : value.toTupleRef().elements()) items.push_back(plain(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

}  // namespace

std::vector<char> pickle(const c10::IValue& value) {
  std::vector<char> data;
  torch::jit::Pickler pickler([&](const char* bytes,
                                  size_t size) { data.insert(data.end(), bytes, bytes + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(plain(value));
  pickler.stop();

  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t size) {
    const char* p = static_cast<const char*>(bytes);
    archive.insert(archive.end(), p, p + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", data.data(), data.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return archive;
}

std::string pickle_string(const c10::IValue& value) {
  const std::vector<char> bytes = pickle(value);
  return std::string(bytes.begin(), bytes.end());
}

namespace {

// Note [What LibTorch's reader requires]
// LibTorch's archive reader (caffe2::serialize::PyTorchStreamReader) refuses an archive
// from its constructor, after miniz has allocated its state, which then leaks (about 1 KB
// per refused file; found by fuzz/torch_load.cpp). So what its constructor requires is
// checked here first, with a message of ours: records in one folder (the first record's),
// and a version record (.data/version, else version) holding a version this LibTorch
// reads. What miniz itself refuses after read_zip accepted the archive still reaches it
// (scripts/sanitize-suppressions/lsan.supp).
void check_torch_archive(std::string_view bytes, const std::vector<ZipRecord>& records,
                         const std::string& where) {
  const std::string expected =
      "; a torch.save or ddp::save_checkpoint file has all its records in one folder, "
      "with a version record. The file is damaged, or not such a file.";
  DDP_CHECK(!records.empty(), where, ": the zip archive holds no records", expected);
  DDP_CHECK(bytes.substr(0, 8) != "PYTORCH1", where,
            ": a file of PyTorch's preview release (magic PYTORCH1), which LibTorch no longer "
            "reads. Save it again with a current PyTorch.");
  const std::string& first = records.front().name;
  const size_t slash = first.find('/');
  DDP_CHECK(slash != std::string::npos, where, ": the archive's first record '", first,
            "' is not in a folder", expected);
  const std::string folder = first.substr(0, slash + 1);
  const ZipRecord* version = nullptr;
  for (const std::string& name : {folder + ".data/version", folder + "version"}) {
    for (const ZipRecord& r : records) {
      if (r.name == name) {
        version = &r;
        break;
      }
    }
    if (version != nullptr) break;
  }
  DDP_CHECK(version != nullptr, where, ": the archive has no record '", folder, "version'",
            expected);
  std::string text(bytes.substr(version->offset, std::min<uint64_t>(version->size, 64)));
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  uint64_t value = 0;
  bool number = !text.empty() && text.size() <= 18 && version->size <= 64;
  for (char c : text) {
    number = number && std::isdigit(static_cast<unsigned char>(c));
    if (number) value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  DDP_CHECK(number, where, ": the archive's version record '", version->name,
            "' does not hold a version number", expected);
  DDP_CHECK(value >= caffe2::serialize::kMinSupportedFileFormatVersion &&
                value <= caffe2::serialize::kMaxSupportedFileFormatVersion,
            where, ": the archive's format version is ", value, ", and this LibTorch reads ",
            caffe2::serialize::kMinSupportedFileFormatVersion, " to ",
            caffe2::serialize::kMaxSupportedFileFormatVersion,
            ". Save it again with a PyTorch whose files this LibTorch reads.");
}

// Note [Tensors inside their storage]
// LibTorch's unpickler builds each tensor from the sizes, strides and offset the pickle
// states, over a storage whose size the archive states, without checking that the one
// fits in the other (found by fuzz/torch_load.cpp: a crafted optimizer state whose
// tensor lies past its empty storage made the first copy read address 0). So every
// tensor that unpickle returns is checked here: dense (strided), no negative stride, and
// its last element inside its storage. Containers shared through the pickle's memo are
// walked once.
void check_tensor_fits(const at::Tensor& t, const std::string& where) {
  if (!t.defined() || t.layout() != c10::kStrided) {
    DDP_CHECK(!t.defined(), where, ": the file holds a ", t.layout(),
              " tensor; only dense tensors are read. The file is damaged, or not a checkpoint.");
    return;
  }
  if (t.numel() == 0) return;
  // The last element's index, in elements from the storage's start; at most 2^62 to stay
  // clear of overflow (no real tensor comes near).
  const uint64_t limit = uint64_t(1) << 62;
  uint64_t last = static_cast<uint64_t>(t.storage_offset());
  bool fits = t.storage_offset() >= 0 && last < limit;
  for (int64_t d = 0; d < t.dim() && fits; ++d) {
    const int64_t size = t.size(d), stride = t.stride(d);
    fits = stride >= 0 && size > 0 &&
           (stride == 0 || static_cast<uint64_t>(size - 1) <= (limit - last) / uint64_t(stride));
    if (fits) last += static_cast<uint64_t>(size - 1) * static_cast<uint64_t>(stride);
  }
  const uint64_t item = t.dtype().itemsize();
  const uint64_t need = fits ? (last + 1) * item : 0;
  const uint64_t have = t.storage().nbytes();
  DDP_CHECK(fits && need <= have && t.storage().data() != nullptr, where, ": a tensor of shape ",
            t.sizes(), ", strides ", t.strides(), " and offset ", t.storage_offset(),
            (fits ? " reaches byte " + std::to_string(need)
                  : std::string(" has a negative or "
                                "overflowing stride")),
            " of its storage, which holds ", have,
            " bytes. The file is damaged or crafted; load another checkpoint.");
}

void check_tensors_fit(const c10::IValue& root, const std::string& where) {
  std::vector<c10::IValue> todo{root};
  std::set<const void*> seen;
  while (!todo.empty()) {
    const c10::IValue v = std::move(todo.back());
    todo.pop_back();
    if (v.isTensor()) {
      check_tensor_fits(v.toTensor(), where);
      continue;
    }
    if (!(v.isGenericDict() || v.isList() || v.isTuple() || v.isObject())) continue;
    if (!seen.insert(v.internalToPointer()).second) continue;
    if (v.isGenericDict()) {
      for (const auto& entry : v.toGenericDict()) {
        todo.push_back(entry.key());
        todo.push_back(entry.value());
      }
    } else if (v.isList()) {
      for (const c10::IValue& x : v.toListRef()) todo.push_back(x);
    } else if (v.isTuple()) {
      for (const c10::IValue& x : v.toTupleRef().elements()) todo.push_back(x);
    } else {
      for (const c10::IValue& x : v.toObjectRef().slots()) todo.push_back(x);
    }
  }
}

// unpickle of `bytes`; `owned`, when given, holds the same bytes and is moved into the
// archive instead of copying them (a chunk of hundreds of megabytes is copied once less).
c10::IValue unpickle_view(std::string_view bytes, std::vector<char>* owned,
                          const std::string& where) {
  // Note [Integrity check]: a torn or corrupted file stops here.
  const std::vector<ZipRecord> records = read_zip(bytes, where);
  check_torch_archive(bytes, records, where);  // Note [What LibTorch's reader requires]
  // Note [Python pickles]: rewrite what this LibTorch's unpickler cannot read.
  std::vector<char> archive;
  bool rewritten = false;
  for (const ZipRecord& record : records) {
    const std::string suffix = "data.pkl";
    if (record.name.size() < suffix.size() ||
        record.name.compare(record.name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const auto pickle =
        rewrite_python_pickle(std::string_view(bytes).substr(record.offset, record.size));
    if (!pickle) break;
    std::vector<std::pair<std::string, std::string_view>> parts;
    for (const ZipRecord& r : records) {
      parts.emplace_back(r.name, &r == &record ? std::string_view(*pickle)
                                               : std::string_view(bytes).substr(r.offset, r.size));
    }
    const std::string zip = write_zip(parts);
    archive.assign(zip.begin(), zip.end());
    rewritten = true;
    break;
  }
  if (!rewritten) {
    if (owned != nullptr) {
      archive = std::move(*owned);
    } else {
      archive.assign(bytes.begin(), bytes.end());
    }
  }

  std::string reason;
  c10::IValue value;
  bool read = false;
  try {
    value = torch::jit::pickle_load(archive);
    if (rewritten) drop_build_states(value);
    read = true;
  } catch (const std::exception& e) {
    reason = e.what();
  }
  if (read) {
    check_tensors_fit(value, where);  // Note [Tensors inside their storage]
    return value;
  }
  const auto newline = reason.find('\n');
  if (newline != std::string::npos) reason.resize(newline);
  DDP_CHECK(false, where, ": the file could not be read (", bytes.size(),
            " bytes; unpickling failed with: ", reason,
            "). Expected a file written by ddp::save_checkpoint or torch.save; load an "
            "older checkpoint instead.");
  return {};
}

}  // namespace

c10::IValue unpickle(const std::string& bytes, const std::string& where) {
  return unpickle_view(bytes, nullptr, where);
}

c10::IValue unpickle(std::vector<char>&& bytes, const std::string& where) {
  return unpickle_view(std::string_view(bytes.data(), bytes.size()), &bytes, where);
}

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

c10::impl::GenericList new_list() { return c10::impl::GenericList(c10::AnyType::get()); }

c10::impl::GenericDict as_dict(const c10::IValue& value, const std::string& what,
                               const std::string& where) {
  DDP_CHECK(value.isGenericDict(), where, ": expected ", what, " to be a dict, but it is ",
            value.tagKind(), ". The file was not written by ddp::save_checkpoint.");
  return value.toGenericDict();
}

c10::IValue get(const c10::impl::GenericDict& dict, const std::string& key, const std::string& what,
                const std::string& where) {
  const auto it = dict.find(key);
  DDP_CHECK(it != dict.end(), where, ": ", what, " has no key '", key,
            "'. The file was written by something other than this version of "
            "ddp::save_checkpoint, or for other settings.");
  return it->value();
}

int64_t get_int(const c10::impl::GenericDict& dict, const std::string& key, const std::string& what,
                const std::string& where) {
  const c10::IValue v = get(dict, key, what, where);
  DDP_CHECK(v.isInt(), where, ": ", what, "['", key, "'] should be an int, but is ", v.tagKind());
  return v.toInt();
}

std::vector<int64_t> get_int_list(const c10::impl::GenericDict& dict, const std::string& key,
                                  const std::string& what, const std::string& where) {
  const c10::IValue v = get(dict, key, what, where);
  DDP_CHECK(v.isList(), where, ": ", what, "['", key, "'] should be a list, but is ", v.tagKind());
  std::vector<int64_t> out;
  for (const c10::IValue& x : v.toList()) {
    DDP_CHECK(x.isInt(), where, ": ", what, "['", key, "'] should hold ints, but holds ",
              x.tagKind());
    out.push_back(x.toInt());
  }
  return out;
}

double get_double(const c10::impl::GenericDict& dict, const std::string& key,
                  const std::string& what, const std::string& where) {
  const c10::IValue v = get(dict, key, what, where);
  DDP_CHECK(v.isDouble() || v.isInt(), where, ": ", what, "['", key,
            "'] should be a float, but is ", v.tagKind());
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

bool get_bool(const c10::impl::GenericDict& dict, const std::string& key, const std::string& what,
              const std::string& where) {
  const c10::IValue v = get(dict, key, what, where);
  DDP_CHECK(v.isBool(), where, ": ", what, "['", key, "'] should be a bool, but is ", v.tagKind());
  return v.toBool();
}

at::Tensor get_tensor(const c10::impl::GenericDict& dict, const std::string& key,
                      const std::string& what, const std::string& where) {
  const c10::IValue v = get(dict, key, what, where);
  DDP_CHECK(v.isTensor(), where, ": ", what, "['", key, "'] should be a tensor, but is ",
            v.tagKind());
  return v.toTensor();
}

c10::Dict<std::string, at::Tensor> tensor_dict(const c10::IValue& value, const std::string& what,
                                               const std::string& where) {
  const c10::impl::GenericDict generic = as_dict(value, what, where);
  c10::Dict<std::string, at::Tensor> out;
  for (const auto& entry : generic) {
    DDP_CHECK(entry.key().isString(), where, ": ", what, " should have string keys, but one is ",
              entry.key().tagKind());
    const std::string key = entry.key().toStringRef();
    DDP_CHECK(entry.value().isTensor(), where, ": ", what, "['", key,
              "'] should be a tensor, but is ", entry.value().tagKind());
    out.insert(key, entry.value().toTensor());
  }
  return out;
}

at::Tensor cpu_copy(const at::Tensor& tensor) {
  at::Tensor t = tensor.detach().to(at::kCPU);
  const bool compact =
      t.is_contiguous() && t.storage_offset() == 0 && t.storage().nbytes() == t.nbytes();
  return compact ? t : t.clone(at::MemoryFormat::Contiguous);
}

std::string shape_string(const at::Tensor& tensor) {
  std::ostringstream os;
  os << tensor.sizes();
  return os.str();
}

}  // namespace detail
}  // namespace ddp
