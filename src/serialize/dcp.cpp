// ddp::dcp: PyTorch's Distributed Checkpoint format, both ways.
//
// Note [DCP save]
// Each rank of the group writes its items to __<rank>_0.distcp: every chunk a complete
// torch.save archive (a tensor of exactly the chunk's sizes), every object the
// torch.save of its value, one after another; their places become its part of the
// metadata. The parts travel to rank 0 as pickled Metadata (the same writer and reader as
// the file), with each rank's verdict; rank 0 merges them, checks that the ranks agree on
// every key's dtype and size, writes .metadata atomically and tells every rank the
// outcome. Tensors that every rank holds whole (and objects) are written by rank 0 only,
// as DCP's planner deduplicates them.
//
// Note [DCP load]
// The metadata is read with the restricted pickle reader (Note [DCP metadata]). For each
// tensor of the state, the saved chunks that meet its block are read (a byte range each,
// bounded by its file's size), checked against the metadata (a tensor, of the chunk's
// sizes and the key's dtype) and their common part staged. The chunks of a key must not
// overlap, and those that meet a block must cover it. Only when every key is staged are
// the copies made.

#include <ddp/serialize/dcp.h>

#include "distributed/common/check.h"
#include "formats/atomic_file.h"
#include "formats/dcp_metadata.h"
#include "formats/optimizer_state.h"
#include "formats/pickle_io.h"
#include "fsdp/shard_unit.h"
#include "optim/zero_state.h"

#include <ddp/distributed/default_group.h>
#include <ddp/distributed/groups.h>
#include <ddp/parallel/tensor_parallel.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <cerrno>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace ddp {
namespace dcp {
namespace {

namespace md = ::ddp::detail::dcp;

constexpr const char* kMetadataFile = ".metadata";

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string shape_of(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// A data file written from the start; close() fsyncs it.
class DataFile {
 public:
  DataFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    DDP_CHECK(fd_ >= 0, "ddp::dcp::save: cannot create '", path_, "': ", std::strerror(errno));
  }
  ~DataFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  int64_t append(const std::vector<char>& bytes) {
    const int64_t at = size_;
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      DDP_CHECK(n > 0, "ddp::dcp::save: cannot write '", path_, "': ", std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    size_ += static_cast<int64_t>(bytes.size());
    return at;
  }
  void close() {
    DDP_CHECK(::fsync(fd_) == 0, "ddp::dcp::save: cannot sync '", path_,
              "': ", std::strerror(errno));
    DDP_CHECK(::close(fd_) == 0, "ddp::dcp::save: cannot close '", path_,
              "': ", std::strerror(errno));
    fd_ = -1;
  }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

std::shared_ptr<ProcessGroup> save_group(const SaveOptions& options) {
  if (options.process_group()) return options.process_group();
  return is_initialized() ? default_group() : nullptr;
}

// The block an item stands for: its tensor, or a scalar view of the one-element shard of
// a 0-d parameter, made at the moment of use (a view kept alive would outlive fully_shard's
// swaps of the parameter's storage).
at::Tensor block_of(const StateDict::Item& item) {
  if (item.kind == StateDict::Item::kShard && item.global_size.empty() && item.tensor.dim() > 0) {
    return item.tensor.view({});
  }
  return item.tensor;
}

md::Storage stored(int64_t offset, const std::vector<char>& bytes, const std::string& name) {
  return md::Storage{name, offset, static_cast<int64_t>(bytes.size())};
}

// This rank's items: written to `file`, described in the returned (partial) metadata.
md::Metadata write_items(const StateDict& state, int rank, const std::string& dir,
                         const std::string& name) {
  md::Metadata meta;
  DataFile file(join(dir, name));
  for (const std::string& key : state.keys()) {
    const StateDict::Item& item = state.item(key);
    md::Entry e;
    e.path.clear();
    for (const auto& p : item.path) {
      e.path.push_back(p.isInt() ? md::PathPart{std::to_string(p.toInt()), p.toInt()}
                                 : md::PathPart{p.toStringRef(), std::nullopt});
    }
    if (item.kind == StateDict::Item::kObject) {
      if (rank != 0) continue;
      const std::vector<char> bytes = detail::pickle(item.value);
      e.is_tensor = false;
      e.object_storage = stored(file.append(bytes), bytes, name);
    } else {
      const at::Tensor t = block_of(item);
      e.is_tensor = true;
      e.dtype = t.scalar_type();
      e.requires_grad = t.requires_grad();
      md::dtype_name(e.dtype);  // throws for a dtype DCP cannot name
      const bool shard = item.kind == StateDict::Item::kShard;
      e.size = shard ? item.global_size : t.sizes().vec();
      const bool writes =
          item.save &&
          (shard ? t.numel() > 0 || (rank == 0 && at::empty(e.size).numel() == 0) : rank == 0);
      if (writes) {
        md::Chunk c{shard ? item.offsets : std::vector<int64_t>(e.size.size(), 0), t.sizes().vec()};
        const std::vector<char> bytes = detail::pickle(detail::cpu_copy(t.detach()));
        e.chunks.push_back(std::move(c));
        e.chunk_storage.push_back(stored(file.append(bytes), bytes, name));
      }
    }
    meta.keys.push_back(key);
    meta.entries.emplace(key, std::move(e));
  }
  file.close();
  return meta;
}

// The parts of every rank put together; throws naming the key where ranks disagree.
md::Metadata merge(const std::vector<md::Metadata>& parts) {
  md::Metadata all;
  for (size_t r = 0; r < parts.size(); ++r) {
    for (const std::string& key : parts[r].keys) {
      const md::Entry& e = parts[r].entries.at(key);
      auto it = all.entries.find(key);
      if (it == all.entries.end()) {
        all.keys.push_back(key);
        all.entries.emplace(key, e);
        continue;
      }
      md::Entry& have = it->second;
      DDP_CHECK(have.is_tensor == e.is_tensor, "ddp::dcp::save: key '", key,
                "' is a tensor on one rank and an object on rank ", r,
                "; every rank must add the same keys.");
      if (!e.is_tensor) continue;
      DDP_CHECK(have.size == e.size && have.dtype == e.dtype, "ddp::dcp::save: key '", key,
                "' is a ", c10::toString(have.dtype), " tensor of size ", shape_of(have.size),
                " on one rank but ", c10::toString(e.dtype), " of size ", shape_of(e.size),
                " on rank ", r, "; every rank must describe the same tensor.");
      // A chunk that another rank wrote already (replicas of the same part) is kept once,
      // as DCP's planner deduplicates replicated items.
      for (size_t c = 0; c < e.chunks.size(); ++c) {
        const bool again =
            std::any_of(have.chunks.begin(), have.chunks.end(), [&](const md::Chunk& h) {
              return h.offsets == e.chunks[c].offsets && h.sizes == e.chunks[c].sizes;
            });
        if (again) continue;
        have.chunks.push_back(e.chunks[c]);
        have.chunk_storage.push_back(e.chunk_storage[c]);
      }
    }
  }
  // A tensor that no rank wrote (state that only some optimizers have) is left out.
  std::vector<std::string> kept;
  for (const std::string& key : all.keys) {
    const md::Entry& e = all.entries.at(key);
    if (e.is_tensor && e.chunks.empty()) {
      all.entries.erase(key);
    } else {
      kept.push_back(key);
    }
  }
  all.keys = std::move(kept);
  return all;
}

// ---- reading ------------------------------------------------------------------------

// Reads [offset, offset + length) of the data file `relative` in `dir`, refusing a path
// that leaves the folder and a range past the file's end.
std::vector<char> read_range(const std::string& dir, const md::Storage& s, const std::string& key,
                             const std::string& where) {
  const std::string& rel = s.relative_path;
  bool climbs = rel.empty() || rel[0] == '/' || rel.find('\0') != std::string::npos;
  size_t start = 0;
  while (!climbs && start <= rel.size()) {
    const size_t end = std::min(rel.find('/', start), rel.size());
    const std::string part = rel.substr(start, end - start);
    if (part == ".." || part.empty() || part == ".") climbs = true;
    start = end + 1;
  }
  DDP_CHECK(!climbs, where, ": key '", key, "' names the data file '", rel,
            "', which is not a plain name inside the checkpoint folder; refusing to read it.");
  const std::string path = join(dir, rel);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DDP_CHECK(fd >= 0, where, ": key '", key, "' is stored in '", path,
            "', which cannot be opened: ", std::strerror(errno),
            ". The checkpoint is incomplete; save it again or use another one.");
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  std::vector<char> bytes;
  std::string error;
  if (!stat_ok) {
    error = std::string("cannot stat it: ") + std::strerror(errno);
  } else if (s.offset > st.st_size || s.length > st.st_size - s.offset) {
    error = "it has " + std::to_string(st.st_size) +
            " bytes, but the metadata places the item at [" + std::to_string(s.offset) + ", " +
            std::to_string(s.offset + s.length) +
            "): the file is truncated or the metadata damaged";
  } else {
    bytes.resize(static_cast<size_t>(s.length));
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::pread(fd, &bytes[done], bytes.size() - done,
                                static_cast<off_t>(s.offset + static_cast<int64_t>(done)));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error = std::string("reading it failed: ") + (n < 0 ? std::strerror(errno) : "early end");
        break;
      }
      done += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  DDP_CHECK(error.empty(), where, ": key '", key, "' in '", path, "': ", error, ".");
  return bytes;
}

md::Metadata read_metadata_of(const std::string& dir, const std::string& where) {
  const std::string path = join(dir, kMetadataFile);
  DDP_CHECK(detail::file_exists(path), where, ": '", dir,
            "' has no .metadata: it is not a DCP checkpoint, or one whose save did not finish "
            "(.metadata is written last). Load another checkpoint.");
  const std::string bytes = detail::read_file(path);
  try {
    return md::read_metadata(bytes, where + " ('" + path + "')");
  } catch (const std::runtime_error& e) {
    detail::throw_error(e.what());
  }
}

// The saved chunk `c` of key `key`, checked against the metadata.
at::Tensor read_chunk(const std::string& dir, const md::Entry& e, size_t c, const std::string& key,
                      const std::string& where) {
  const md::Storage& s = e.chunk_storage[c];
  std::vector<char> bytes = read_range(dir, s, key, where);
  const std::string what = where + ": key '" + key + "', chunk at " +
                           shape_of(e.chunks[c].offsets) + " in '" + s.relative_path + "'";
  c10::IValue v;
  try {
    v = detail::unpickle(std::move(bytes), what);
  } catch (const std::exception& ex) {
    detail::throw_error(std::string(ex.what()));
  }
  DDP_CHECK(v.isTensor(), what, ": holds a ", v.tagKind(), ", not a tensor.");
  at::Tensor t = v.toTensor();
  DDP_CHECK(t.sizes().vec() == e.chunks[c].sizes, what, ": the tensor has size ",
            shape_of(t.sizes().vec()), ", but the metadata says ", shape_of(e.chunks[c].sizes),
            ".");
  DDP_CHECK(t.scalar_type() == e.dtype, what, ": the tensor is ", c10::toString(t.scalar_type()),
            ", but the metadata says ", c10::toString(e.dtype), ".");
  return t;
}

int64_t volume(const std::vector<int64_t>& sizes) {
  int64_t v = 1;
  for (int64_t s : sizes) v *= s;
  return v;
}

void check_no_overlap(const md::Entry& e, const std::string& key, const std::string& where) {
  for (size_t a = 0; a < e.chunks.size(); ++a) {
    for (size_t b = a + 1; b < e.chunks.size(); ++b) {
      bool meet = volume(e.chunks[a].sizes) > 0 && volume(e.chunks[b].sizes) > 0;
      for (size_t d = 0; meet && d < e.size.size(); ++d) {
        const int64_t lo = std::max(e.chunks[a].offsets[d], e.chunks[b].offsets[d]);
        const int64_t hi = std::min(e.chunks[a].offsets[d] + e.chunks[a].sizes[d],
                                    e.chunks[b].offsets[d] + e.chunks[b].sizes[d]);
        meet = lo < hi;
      }
      DDP_CHECK(!meet, where, ": key '", key, "' has chunks at ", shape_of(e.chunks[a].offsets),
                " and ", shape_of(e.chunks[b].offsets), " that overlap; the metadata is damaged.");
    }
  }
}

// The block [offsets, offsets + sizes) of key `key`, put together from the saved chunks
// that meet it.
at::Tensor read_block(const std::string& dir, const md::Entry& e,
                      const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes,
                      const std::string& key, const std::string& where) {
  // A chunk that is the block itself (a load at the world size of the save): its tensor,
  // not a copy of it.
  for (size_t c = 0; c < e.chunks.size(); ++c) {
    if (e.chunks[c].offsets == offsets && e.chunks[c].sizes == sizes && volume(sizes) > 0) {
      return read_chunk(dir, e, c, key, where);
    }
  }
  at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(e.dtype));
  int64_t covered = 0;
  for (size_t c = 0; c < e.chunks.size(); ++c) {
    const md::Chunk& ch = e.chunks[c];
    std::vector<int64_t> lo(sizes.size()), hi(sizes.size());
    bool meet = true;
    for (size_t d = 0; d < sizes.size(); ++d) {
      lo[d] = std::max(offsets[d], ch.offsets[d]);
      hi[d] = std::min(offsets[d] + sizes[d], ch.offsets[d] + ch.sizes[d]);
      meet = meet && lo[d] < hi[d];
    }
    if (!meet) continue;
    const at::Tensor saved = read_chunk(dir, e, c, key, where);
    at::Tensor src = saved, dst = out;
    int64_t n = 1;
    for (size_t d = 0; d < sizes.size(); ++d) {
      const int64_t dim = static_cast<int64_t>(d);
      src = src.narrow(dim, lo[d] - ch.offsets[d], hi[d] - lo[d]);
      dst = dst.narrow(dim, lo[d] - offsets[d], hi[d] - lo[d]);
      n *= hi[d] - lo[d];
    }
    dst.copy_(src);
    covered += n;
  }
  DDP_CHECK(covered == volume(sizes), where, ": key '", key, "': the saved chunks cover ", covered,
            " of the ", volume(sizes), " elements of the block at ", shape_of(offsets), " of size ",
            shape_of(sizes), "; the checkpoint is missing a part of this tensor.");
  return out;
}

// Sets path[i:] of `container` (a dict, or a list where the part is an index) to `value`,
// making the dicts and lists on the way, as dcp_to_torch_save's unflattening does.
void put(const c10::IValue& container, const std::vector<md::PathPart>& path, size_t i,
         const c10::IValue& value, const std::string& key, const std::string& where) {
  const md::PathPart& part = path[i];
  const bool last = i + 1 == path.size();
  auto fresh = [&]() -> c10::IValue {
    if (last) return value;
    if (path[i + 1].index) return detail::new_list();
    return detail::new_dict();
  };
  if (part.index) {
    DDP_CHECK(container.isList(), where, ": key '", key, "' indexes a value that is not a list.");
    c10::impl::GenericList list = container.toList();
    const int64_t at = *part.index;
    DDP_CHECK(at >= 0 && at < (int64_t{1} << 20), where, ": key '", key, "' has the list index ",
              at, ".");
    while (static_cast<int64_t>(list.size()) <= at) list.push_back(c10::IValue());
    if (last || list.get(at).isNone()) list.set(at, fresh());
    if (!last) put(list.get(at), path, i + 1, value, key, where);
    return;
  }
  DDP_CHECK(container.isGenericDict(), where, ": key '", key,
            "' nests inside a value that is not a dict.");
  c10::impl::GenericDict dict = container.toGenericDict();
  if (last || !dict.contains(part.name)) dict.insert_or_assign(part.name, fresh());
  if (!last) put(dict.at(part.name), path, i + 1, value, key, where);
}

}  // namespace

// ---- StateDict ----------------------------------------------------------------------

StateDict& StateDict::add(const std::string& key, Item item) {
  DDP_CHECK(!key.empty(), "ddp::dcp::StateDict: a key must not be empty.");
  DDP_CHECK(!items_.count(key), "ddp::dcp::StateDict: key '", key, "' was added twice.");
  if (item.path.empty()) item.path = {c10::IValue(key)};
  order_.push_back(key);
  items_.emplace(key, std::move(item));
  return *this;
}

StateDict& StateDict::add_tensor(const std::string& key, at::Tensor tensor) {
  DDP_CHECK(tensor.defined(), "ddp::dcp::StateDict: key '", key, "' got an undefined tensor.");
  Item item;
  item.kind = Item::kTensor;
  item.tensor = std::move(tensor);
  return add(key, std::move(item));
}

StateDict& StateDict::add_shard(const std::string& key, at::Tensor local,
                                std::vector<int64_t> global_size, std::vector<int64_t> offsets) {
  DDP_CHECK(local.defined(), "ddp::dcp::StateDict: key '", key, "' got an undefined tensor.");
  DDP_CHECK(offsets.size() == global_size.size() &&
                static_cast<int64_t>(global_size.size()) == local.dim(),
            "ddp::dcp::StateDict: key '", key, "': the block has ", local.dim(),
            " dimensions, the global size ", global_size.size(), " and the offsets ",
            offsets.size(), "; give all three the tensor's number of dimensions.");
  for (size_t d = 0; d < offsets.size(); ++d) {
    DDP_CHECK(offsets[d] >= 0 && offsets[d] + local.size(static_cast<int64_t>(d)) <= global_size[d],
              "ddp::dcp::StateDict: key '", key, "': the block of size ",
              shape_of(local.sizes().vec()), " at ", shape_of(offsets),
              " reaches outside the global size ", shape_of(global_size), ".");
  }
  Item item;
  item.kind = Item::kShard;
  item.tensor = std::move(local);
  item.global_size = std::move(global_size);
  item.offsets = std::move(offsets);
  return add(key, std::move(item));
}

StateDict& StateDict::add_object(const std::string& key, c10::IValue value) {
  Item item;
  item.kind = Item::kObject;
  item.value = std::move(value);
  return add(key, std::move(item));
}

namespace {

// Where a parameter at rest sits in its full tensor: its part under fully_shard (its rows)
// and tensor parallelism (its chunk along the style's dimension), or both (Note
// [Tensor-parallel forward] in src/tensor_parallel/tensor_parallel.cpp). nullopt: held
// whole. `skip`: a scalar that another rank holds.
struct Placed {
  std::vector<int64_t> global_size, offsets;
  bool save = true;
  bool skip = false;
};

std::optional<Placed> placement_of(const at::Tensor& t, const std::string& name,
                                   const char* where) {
  std::optional<Placed> out;
  if (const auto ref = detail::sharded_ref(t)) {
    const detail::ShardedParam& p = *ref.param;
    const auto& replicate = ref.unit->replicate();
    out.emplace();
    out->global_size = p.sizes;
    out->save = !replicate || replicate->rank() == 0;  // the other replicas hold the same rows
    if (p.sizes.empty()) {
      // A scalar lives on the rank that holds its one row; it is held as that one-row
      // shard, which block_of() views as a scalar.
      out->skip = p.local_rows == 0;
    } else {
      // At rest the parameter is this rank's rows (Note [Shards in place]): it is held
      // itself, never through a view, which would outlive fully_shard's swaps of its
      // storage.
      DDP_CHECK(t.sizes().vec() == p.shard_sizes(p.local_rows), where, ": '", name,
                "' is not at rest (its full parameters are out); add the model between "
                "steps.");
      out->offsets.assign(p.sizes.size(), 0);
      out->offsets[0] = p.first_row(ref.unit->group().rank());
    }
  }
  if (const auto tp = tensor_parallel_shard(t)) {
    if (!out) {
      out.emplace();
      out->offsets.assign(tp->full_size.size(), 0);
    }
    out->global_size = tp->full_size;
    out->offsets[static_cast<size_t>(tp->dim)] += tp->offset;
  }
  return out;
}

}  // namespace

StateDict& StateDict::add_model(const torch::nn::Module& model, const std::string& prefix) {
  auto add_one = [&](const std::string& name, const at::Tensor& t) {
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    Item item;
    item.path =
        prefix.empty() ? std::vector<c10::IValue>{name} : std::vector<c10::IValue>{prefix, name};
    item.tensor = t;
    if (const auto placed = placement_of(t, name, "ddp::dcp::StateDict::add_model")) {
      if (placed->skip) return;
      item.kind = Item::kShard;
      item.global_size = placed->global_size;
      item.offsets = placed->offsets;
      item.save = placed->save;
    } else {
      item.kind = Item::kTensor;
    }
    add(key, std::move(item));
  };
  for (const auto& p : model.named_parameters(/*recurse=*/true)) add_one(p.key(), p.value());
  for (const auto& b : model.named_buffers(/*recurse=*/true)) add_one(b.key(), b.value());
  return *this;
}

// Note [Optimizer state in DCP]
// PyTorch's get_optimizer_state_dict keys the state by parameter name:
// {"state": {name: {"step": tensor(float32), "exp_avg": ..., ...}},
//  "param_groups": [{"lr": ..., ..., "params": [name, ...]}]}, and dcp.save flattens it to
// "optim.state.<name>.exp_avg" and "optim.param_groups.<i>.lr". The same keys here, so
// that dcp.load into get_state_dict(model, optimizer) of the same architecture just works,
// and the reverse. Python's optimizers have hyperparameters LibTorch's lack (maximize,
// foreach, ...): they are written with Python's defaults and optional on load. Loading
// builds optimizer_state_dict's layout from the staged values and restores it through
// prepare_optimizer_load, the same path as a checkpoint file.
namespace {

std::string join_key(const std::vector<c10::IValue>& path) {
  std::string key;
  for (const auto& p : path) {
    key += (key.empty() ? "" : ".") + (p.isInt() ? std::to_string(p.toInt()) : p.toStringRef());
  }
  return key;
}

// optim.param_groups.<i>.<hyperparameter> and .params (the parameters' names) of `groups`
// (optimizer_state_dict's param_groups, "params" holding indices into `names`).
void add_group_items(StateDict& state, const c10::impl::GenericList& groups,
                     const c10::impl::GenericList& names, const std::string& type,
                     const std::string& prefix) {
  auto add_item = [&state](StateDict::Item item) {
    const std::string key = join_key(item.path);
    state.add_item(key, std::move(item));
  };
  // Hyperparameters: LibTorch's (required on load) and Python's others (optional).
  std::vector<std::pair<std::string, c10::IValue>> extras = {{"maximize", false},
                                                             {"foreach", c10::IValue()},
                                                             {"differentiable", false},
                                                             {"fused", c10::IValue()}};
  if (type != "SGD") {
    extras.emplace_back("capturable", false);
    extras.emplace_back("decoupled_weight_decay", type == "AdamW");
  }
  int64_t first = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const c10::impl::GenericDict g = groups.get(gi).toGenericDict();
    auto add_group_value = [&](const std::string& k, c10::IValue v, bool optional) {
      StateDict::Item item;
      item.kind = StateDict::Item::kObject;
      item.path = {prefix, "param_groups", static_cast<int64_t>(gi), k};
      item.value = std::move(v);
      item.optional = optional;
      add_item(std::move(item));
    };
    for (const auto& entry : g) {
      const std::string k = entry.key().toStringRef();
      if (k != "params") add_group_value(k, entry.value(), false);
    }
    for (const auto& [k, v] : extras) add_group_value(k, v, true);
    c10::impl::GenericList group_names = detail::new_list();
    const int64_t count = static_cast<int64_t>(g.at("params").toList().size());
    for (int64_t j = 0; j < count; ++j) group_names.push_back(names.get(first + j));
    add_group_value("params", group_names, false);
    first += count;
  }
}

// optimizer_state_dict's layout of the staged values of an optimizer's keys: "state" by
// index into `names`, "param_groups" as `groups` with the saved hyperparameters, "type"
// and "param_names"; throws when the checkpoint's groups list other parameters.
c10::impl::GenericDict staged_optimizer_state(const std::map<std::string, c10::IValue>& staged,
                                              const std::string& prefix, const std::string& type,
                                              const c10::impl::GenericList& names,
                                              const c10::impl::GenericList& groups,
                                              const std::string& where) {
  auto find_staged = [&](const std::vector<c10::IValue>& path) -> const c10::IValue* {
    const auto it = staged.find(join_key(path));
    return it == staged.end() ? nullptr : &it->second;
  };
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList out_groups = detail::new_list();
  int64_t index = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const c10::impl::GenericDict mine = groups.get(gi).toGenericDict();
    c10::impl::GenericDict g = detail::new_dict();
    for (const auto& entry : mine) {
      const std::string k = entry.key().toStringRef();
      if (k == "params") continue;
      const c10::IValue* v = find_staged({prefix, "param_groups", static_cast<int64_t>(gi), k});
      g.insert(k, v ? *v : entry.value());
    }
    const c10::IValue* saved_params =
        find_staged({prefix, "param_groups", static_cast<int64_t>(gi), "params"});
    const int64_t count = static_cast<int64_t>(mine.at("params").toList().size());
    std::string listed;
    if (saved_params && saved_params->isList()) {
      const c10::impl::GenericList names = saved_params->toList();
      for (size_t i = 0; i < names.size(); ++i) {
        const c10::IValue n = names.get(i);
        listed +=
            (listed.empty() ? "" : ", ") + (n.isString() ? n.toStringRef() : std::string("?"));
      }
    }
    c10::List<int64_t> indices;
    for (int64_t j = 0; j < count; ++j, ++index) {
      const std::string name = names.get(index).toStringRef();
      DDP_CHECK(saved_params && saved_params->isList() &&
                    static_cast<int64_t>(saved_params->toList().size()) == count &&
                    saved_params->toList().get(j).isString() &&
                    saved_params->toList().get(j).toStringRef() == name,
                where, ": param group ", gi, " of the checkpoint's optimizer holds [", listed,
                "], but this optimizer's holds ", count, " parameters, #", j, " being '", name,
                "'. Create the optimizer over the same parameters, in the same groups.");
      indices.push_back(index);
      c10::impl::GenericDict s = detail::new_dict();
      for (const char* k : {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"}) {
        if (const c10::IValue* v = find_staged({prefix, "state", name, k})) s.insert(k, *v);
      }
      if (s.size() > 0) state.insert(index, s);
    }
    g.insert("params", indices);
    out_groups.push_back(g);
  }
  c10::impl::GenericDict dict = detail::new_dict();
  dict.insert("state", state);
  dict.insert("param_groups", out_groups);
  dict.insert("type", type);
  dict.insert("param_names", names);
  return dict;
}

}  // namespace

StateDict& StateDict::add_optimizer(torch::optim::Optimizer& optimizer,
                                    const torch::nn::Module& model, const std::string& prefix) {
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer)) {
    return add_zero_optimizer(*zero, model, prefix);
  }
  const c10::impl::GenericDict py = detail::optimizer_state_dict(optimizer, model);
  const std::string type = py.at("type").toStringRef();
  const c10::impl::GenericDict saved_state = py.at("state").toGenericDict();
  const c10::impl::GenericList groups = py.at("param_groups").toList();
  const c10::impl::GenericList names = py.at("param_names").toList();
  std::vector<at::Tensor> params;
  for (const auto& g : optimizer.param_groups()) {
    for (const auto& p : g.params()) params.push_back(p);
  }
  // The state tensors of each type; "step" is Python's float32 scalar.
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string name = names.get(i).toStringRef();
    DDP_CHECK(!name.empty(), "ddp::dcp::StateDict::add_optimizer: the optimizer's parameter #", i,
              " is not a parameter of the model given; pass the model the optimizer steps.");
    const at::Tensor& p = params[i];
    const auto found = saved_state.find(static_cast<int64_t>(i));
    c10::impl::GenericDict st =
        found == saved_state.end() ? detail::new_dict() : found->value().toGenericDict();
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    if (type == "SGD") {
      if (st.contains("momentum_buffer")) {
        tensors.emplace_back("momentum_buffer", st.at("momentum_buffer").toTensor());
      }
    } else {
      const int64_t step = st.contains("step") ? st.at("step").toInt() : 0;
      tensors.emplace_back("step", at::scalar_tensor(static_cast<double>(step), at::kFloat));
      for (const char* k : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}) {
        if (st.contains(k)) {
          tensors.emplace_back(k, st.at(k).toTensor());
        } else if (std::string(k) != "max_exp_avg_sq") {
          tensors.emplace_back(k, at::zeros_like(p.detach(), at::MemoryFormat::Contiguous).cpu());
        }
      }
    }
    const auto placed = placement_of(p, name, "ddp::dcp::StateDict::add_optimizer");
    for (auto& [k, t] : tensors) {
      Item item;
      item.path = {prefix, "state", name, k};
      item.tensor = t;
      // With HSDP the other replicas hold the same rows: the first writes them.
      if (placed) item.save = placed->save;
      if (placed && k != "step") {
        if (placed->skip) continue;  // a scalar another rank holds
        item.kind = Item::kShard;
        item.global_size = placed->global_size;
        item.offsets = placed->offsets;
      } else {
        item.kind = Item::kTensor;
      }
      const std::string key = join_key(item.path);
      add(key, std::move(item));
    }
  }
  add_group_items(*this, groups, names, type, prefix);
  restores_.push_back(
      [&optimizer, &model, prefix, type, names,
       groups](const std::map<std::string, c10::IValue>& staged, const std::string& where) {
        const c10::impl::GenericDict dict =
            staged_optimizer_state(staged, prefix, type, names, groups, where);
        return detail::prepare_optimizer_load(optimizer, model, dict, where);
      });
  return *this;
}

// ZeroRedundancyOptimizer: each rank steps whole parameters (zero.owners()), so each state
// tensor is written whole by its owner (a one-chunk shard of the full tensor) under the
// same keys as a plain optimizer's (Note [Optimizer state in DCP]). On load every rank
// reads all of them and keeps its own partition's, at any world size, through the same
// path as a checkpoint file's (prepare_zero_load).
StateDict& StateDict::add_zero_optimizer(ZeroRedundancyOptimizer& zero,
                                         const torch::nn::Module& model,
                                         const std::string& prefix) {
  const torch::optim::Optimizer& local = zero.local_optimizer();
  const c10::impl::GenericDict py = detail::optimizer_state_dict(local, model);
  const std::string type = py.at("type").toStringRef();
  const int me = zero.process_group()->rank();
  // This rank's state, by parameter name.
  std::map<std::string, c10::impl::GenericDict> mine;
  {
    const c10::impl::GenericDict st = py.at("state").toGenericDict();
    const c10::impl::GenericList local_names = py.at("param_names").toList();
    for (const auto& e : st) {
      mine.emplace(local_names.get(e.key().toInt()).toStringRef(), e.value().toGenericDict());
    }
  }
  std::map<c10::TensorImpl*, std::string> names;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    names.emplace(p.value().unsafeGetTensorImpl(), p.key());
  }
  c10::impl::GenericList all_names = detail::new_list();
  c10::impl::GenericList groups = detail::new_list();
  const auto& local_groups = py.at("param_groups").toList();
  size_t index = 0;
  for (size_t gi = 0; gi < zero.param_groups().size(); ++gi) {
    c10::impl::GenericDict g = detail::new_dict();
    for (const auto& e : local_groups.get(gi).toGenericDict()) {
      if (e.key().toStringRef() != "params") g.insert(e.key(), e.value());
    }
    c10::List<int64_t> params;
    for (const auto& p : zero.param_groups()[gi].params()) {
      const auto it = names.find(p.unsafeGetTensorImpl());
      DDP_CHECK(it != names.end(),
                "ddp::dcp::StateDict::add_optimizer: the optimizer's parameter #", index,
                " is not a parameter of the model given; pass the model the optimizer steps.");
      const std::string name = it->second;
      all_names.push_back(name);
      params.push_back(static_cast<int64_t>(index));
      const bool owner = zero.owners()[index] == me;
      const auto found = mine.find(name);
      const c10::impl::GenericDict st = found == mine.end() ? detail::new_dict() : found->second;
      std::vector<std::pair<std::string, at::Tensor>> tensors;
      if (type == "SGD") {
        if (st.contains("momentum_buffer") || !owner) {
          tensors.emplace_back("momentum_buffer", st.contains("momentum_buffer")
                                                      ? st.at("momentum_buffer").toTensor()
                                                      : at::zeros_like(p.detach()).cpu());
        }
      } else {
        const int64_t step = st.contains("step") ? st.at("step").toInt() : 0;
        tensors.emplace_back("step", at::scalar_tensor(static_cast<double>(step), at::kFloat));
        for (const char* k : {"exp_avg", "exp_avg_sq"}) {
          tensors.emplace_back(k, st.contains(k) ? st.at(k).toTensor()
                                                 : at::zeros_like(p.detach()).cpu());
        }
        if (st.contains("max_exp_avg_sq")) {
          tensors.emplace_back("max_exp_avg_sq", st.at("max_exp_avg_sq").toTensor());
        }
      }
      for (auto& [k, t] : tensors) {
        Item item;
        item.path = {prefix, "state", name, k};
        item.kind = Item::kShard;  // whole, written by its owner only
        item.tensor = t;
        item.global_size = t.sizes().vec();
        item.offsets.assign(item.global_size.size(), 0);
        item.save = owner;
        // Written only where the owner has it; a key no rank wrote is dropped (merge).
        item.optional = k == "max_exp_avg_sq" || k == "momentum_buffer";
        const std::string key = join_key(item.path);
        add(key, std::move(item));
      }
      ++index;
    }
    g.insert("params", params);
    groups.push_back(g);
  }
  add_group_items(*this, groups, all_names, type, prefix);
  restores_.push_back(
      [&zero, &model, prefix, type, all_names,
       groups](const std::map<std::string, c10::IValue>& staged, const std::string& where) {
        const c10::impl::GenericDict dict =
            staged_optimizer_state(staged, prefix, type, all_names, groups, where);
        return detail::prepare_zero_load(zero, model, dict, where);
      });
  return *this;
}

const StateDict::Item& StateDict::item(const std::string& key) const {
  auto it = items_.find(key);
  DDP_CHECK(it != items_.end(), "ddp::dcp::StateDict has no key '", key, "'.");
  return it->second;
}

StateDict::Item& StateDict::mutable_item(const std::string& key) {
  auto it = items_.find(key);
  DDP_CHECK(it != items_.end(), "ddp::dcp::StateDict has no key '", key, "'.");
  return it->second;
}

const c10::IValue& StateDict::object(const std::string& key) const {
  const Item& it = item(key);
  DDP_CHECK(it.kind == Item::kObject, "ddp::dcp::StateDict: key '", key,
            "' is a tensor, not an object.");
  return it.value;
}

// ---- save, load -----------------------------------------------------------------------

void save(const StateDict& state, const std::string& dir, const SaveOptions& options) {
  const std::shared_ptr<ProcessGroup> group = save_group(options);
  const int rank = group ? group->rank() : 0;
  const int world = group ? group->size() : 1;
  const std::string name = "__" + std::to_string(rank) + "_0.distcp";
  // Rank 0 first takes away an old .metadata, before any rank overwrites a data file.
  std::string error;
  if (rank == 0) {
    try {
      detail::make_directories(dir);
      DDP_CHECK(detail::remove_file(join(dir, kMetadataFile)),
                "ddp::dcp::save: cannot remove the old '", join(dir, kMetadataFile),
                "': ", std::strerror(errno));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (group) {
    std::vector<std::string> first = group->all_gather_bytes(error);
    error = first[0];
  }
  DDP_CHECK(error.empty(), error);
  std::string part;
  try {
    part = md::write_metadata(write_items(state, rank, dir, name));
  } catch (const std::exception& e) {
    error = "rank " + std::to_string(rank) + ": " + e.what();
  }
  // Every rank's part, or its error, at every rank (Note [DCP save]).
  std::vector<std::string> parts{error.empty() ? "ok" + part : "no" + error};
  if (group) parts = group->all_gather_bytes(parts[0]);
  for (const std::string& p : parts) {
    if (p.rfind("no", 0) == 0) {
      detail::throw_error("ddp::dcp::save('" + dir + "') failed: " + p.substr(2) +
                          ". No .metadata was written.");
    }
  }
  std::string verdict;
  if (rank == 0) {
    try {
      std::vector<md::Metadata> metas;
      for (int r = 0; r < world; ++r) {
        metas.push_back(md::read_metadata(std::string_view(parts[r]).substr(2),
                                          "ddp::dcp::save: rank " + std::to_string(r) + "'s part"));
      }
      detail::write_file_atomic(join(dir, kMetadataFile), md::write_metadata(merge(metas)));
    } catch (const std::exception& e) {
      verdict = e.what();
    }
  }
  if (group) verdict = group->all_gather_bytes(verdict)[0];
  if (!verdict.empty()) {
    detail::throw_error("ddp::dcp::save('" + dir + "') failed on rank 0: " + verdict);
  }
}

// ---- async_save -------------------------------------------------------------------------

// Note [DCP async save]
// async_save copies the state's tensors (clones on the host) at the call, then a thread
// runs save() on the copy. save()'s exchanges (Note [DCP save]) run on a group made for
// this save with new_group over the save group's ranks, at the call, where every rank is;
// the training's collectives on the save group go on meanwhile without interleaving with
// them. The previous async_save on the same group is waited for first, so one is in flight
// per group, and its group is released then, when every rank is past it. The last one
// stays held until the process ends (never destroyed during exit): wait() for it before
// leaving, or a kill mid-save leaves its folder without .metadata, refused as unfinished.

}  // namespace dcp

namespace detail {

struct DcpAsyncSave {
  std::thread thread;
  std::atomic<bool> finished{false};
  std::exception_ptr error;
  std::shared_ptr<ProcessGroup> group;  // the save's own group, held until the next save
  std::mutex join_mutex;

  void join() {
    std::lock_guard<std::mutex> lock(join_mutex);
    if (thread.joinable()) thread.join();
  }
};

}  // namespace detail

namespace dcp {
namespace {

std::mutex& async_mutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

// The last async_save per save group (nullptr: no group), never destroyed at exit.
std::map<const ProcessGroup*, std::shared_ptr<::ddp::detail::DcpAsyncSave>>& async_saves() {
  static auto* saves =
      new std::map<const ProcessGroup*, std::shared_ptr<::ddp::detail::DcpAsyncSave>>();
  return *saves;
}

// A copy of `state` whose tensors are host clones, taken now.
StateDict snapshot(const StateDict& state) {
  StateDict copy;
  for (const std::string& key : state.keys()) {
    StateDict::Item item = state.item(key);
    if (item.kind != StateDict::Item::kObject) {
      item.tensor = item.tensor.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
    copy.add_item(key, std::move(item));
  }
  return copy;
}

}  // namespace

void AsyncSaveHandle::wait() {
  if (!state_) return;
  state_->join();
  if (state_->error) std::rethrow_exception(state_->error);
}

bool AsyncSaveHandle::done() const { return !state_ || state_->finished.load(); }

AsyncSaveHandle async_save(const StateDict& state, const std::string& dir,
                           const SaveOptions& options) {
  const std::shared_ptr<ProcessGroup> group = save_group(options);
  std::shared_ptr<::ddp::detail::DcpAsyncSave> previous;
  {
    std::lock_guard<std::mutex> lock(async_mutex());
    auto& saves = async_saves();
    const auto it = saves.find(group.get());
    if (it != saves.end()) previous = it->second;
  }
  if (previous) {
    previous->join();
    if (previous->error) {
      {
        std::lock_guard<std::mutex> lock(async_mutex());
        async_saves().erase(group.get());
      }
      std::rethrow_exception(previous->error);
    }
  }
  auto next = std::make_shared<::ddp::detail::DcpAsyncSave>();
  if (group) next->group = new_group(group->ranks(), GroupOptions(), group);
  StateDict copy = snapshot(state);
  {
    std::lock_guard<std::mutex> lock(async_mutex());
    async_saves()[group.get()] = next;  // releases the previous one and its group
  }
  previous.reset();
  next->thread = std::thread([next, copy = std::move(copy), dir]() mutable {
    try {
      save(copy, dir, SaveOptions().process_group(next->group));
    } catch (...) {
      next->error = std::current_exception();
    }
    next->finished = true;
  });
  AsyncSaveHandle handle;
  handle.state_ = next;
  return handle;
}

void load(StateDict& state, const std::string& dir) {
  const std::string where = "ddp::dcp::load('" + dir + "')";
  const md::Metadata meta = read_metadata_of(dir, where);
  std::string missing;
  for (const std::string& key : state.keys()) {
    if (!meta.entries.count(key) && !state.item(key).optional) {
      missing += (missing.empty() ? "'" : ", '") + key + "'";
    }
  }
  if (!missing.empty()) {
    std::string have;
    for (size_t i = 0; i < meta.keys.size() && i < 8; ++i) {
      have += (i ? ", '" : "'") + meta.keys[i] + "'";
    }
    if (meta.keys.size() > 8) have += ", ...";
    detail::throw_error(where + ": the checkpoint has no key " + missing + " (it holds " +
                        std::to_string(meta.keys.size()) + " keys: " + have +
                        "). Check the prefix given to add_model or add_optimizer, or the model.");
  }
  // Stage everything, then apply (Note [DCP load]).
  std::map<std::string, c10::IValue> staged;
  for (const std::string& key : state.keys()) {
    const StateDict::Item& item = state.item(key);
    const auto found = meta.entries.find(key);
    if (found == meta.entries.end()) continue;  // optional
    const md::Entry& e = found->second;
    if (item.kind == StateDict::Item::kObject) {
      DDP_CHECK(!e.is_tensor, where, ": key '", key,
                "' is a tensor in the checkpoint, not an object.");
      staged[key] = detail::unpickle(read_range(dir, e.object_storage, key, where),
                                     where + ": key '" + key + "'");
      continue;
    }
    DDP_CHECK(e.is_tensor, where, ": key '", key,
              "' is an object in the checkpoint, not a tensor.");
    const std::vector<int64_t> global =
        item.kind == StateDict::Item::kShard ? item.global_size : block_of(item).sizes().vec();
    DDP_CHECK(global == e.size, where, ": key '", key, "' has size ", shape_of(e.size),
              " in the checkpoint, but ", shape_of(global),
              " here. Build the same model before loading.");
    check_no_overlap(e, key, where);
    const std::vector<int64_t> offsets = item.kind == StateDict::Item::kShard
                                             ? item.offsets
                                             : std::vector<int64_t>(global.size(), 0);
    staged[key] = read_block(dir, e, offsets, block_of(item).sizes().vec(), key, where);
  }
  std::vector<std::function<void()>> restores;
  for (const auto& restore : state.restores_) restores.push_back(restore(staged, where));
  for (const auto& [key, value] : staged) {
    StateDict::Item& item = state.mutable_item(key);
    if (item.kind == StateDict::Item::kObject) {
      item.value = value;
    } else {
      at::NoGradGuard no_grad;
      block_of(item).copy_(value.toTensor());
    }
  }
  for (auto& f : restores) f();
}

std::vector<std::string> checkpoint_keys(const std::string& dir) {
  return read_metadata_of(dir, "ddp::dcp::checkpoint_keys('" + dir + "')").keys;
}

void to_torch_save(const std::string& dir, const std::string& file) {
  const std::string where = "ddp::dcp::to_torch_save('" + dir + "')";
  const md::Metadata meta = read_metadata_of(dir, where);
  c10::impl::GenericDict root = detail::new_dict();
  for (const std::string& key : meta.keys) {
    const md::Entry& e = meta.entries.at(key);
    c10::IValue value;
    if (e.is_tensor) {
      check_no_overlap(e, key, where);
      value = read_block(dir, e, std::vector<int64_t>(e.size.size(), 0), e.size, key, where);
    } else {
      value = detail::unpickle(read_range(dir, e.object_storage, key, where),
                               where + ": key '" + key + "'");
    }
    std::vector<md::PathPart> path = e.path;
    if (path.empty()) path.push_back(md::PathPart{key, std::nullopt});
    put(root, path, 0, value, key, where);
  }
  detail::make_directories(detail::parent_directory(file));
  const std::vector<char> bytes = detail::pickle(root);
  detail::write_file_atomic(file, std::string_view(bytes.data(), bytes.size()));
}

}  // namespace dcp
}  // namespace ddp
