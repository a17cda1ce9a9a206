// save_sharded_checkpoint / load_sharded_checkpoint. Folders are DCP checkpoints
// (Note [Checkpoints in DCP folders] in checkpoint_dcp.cpp); the first format, one file per
// rank, is still read.
//
// Note [Sharded checkpoint folders]
// The first format (still read, no longer written). A folder holds shard-<r>-of-<N>.pt
// for r < N and, last, `complete`, which rank 0 writes after every rank has written its
// file (a verdict exchange, as Note [Save barrier]); a folder without it is not loaded. Each file is a dict Python's torch.load
// reads: "model" (this rank's state dict: its rows of each fully_shard parameter, the
// other tensors whole), "rows" (per sharded key: [first row, rows, full sizes...]),
// "optimizer" (optimizer_state_dict's layout, this rank's rows), "rng" (this rank's),
// "epoch", "step", "world_size", "rank", "extra". Loading at M ranks: each rank reads the
// files and copies, for each sharded tensor, the part of every saved rank's rows that
// falls in its own rows; the result is then validated and applied as a normal load.

#include <ddp/serialize/checkpoint.h>

#include "distributed/common/check.h"
#include "fsdp/shard_unit.h"
#include "formats/atomic_file.h"
#include "serialize/checkpoint_io.h"
#include "formats/optimizer_state.h"
#include "formats/pickle_io.h"
#include "formats/rng_state.h"
#include "serialize/state_dict.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <unordered_map>

namespace ddp {
namespace {

using detail::ShardedParam;
using detail::ShardUnit;

constexpr const char* kShardedFormat = "ddp-cpp sharded checkpoint";
constexpr int64_t kShardedVersion = 1;

std::string shard_file(const std::string& dir, int64_t r, int64_t n) {
  return dir + "/shard-" + std::to_string(r) + "-of-" + std::to_string(n) + ".pt";
}

/// Sharded parameters by model key.
std::map<std::string, detail::ShardedRef> sharded_by_key(const torch::nn::Module& model) {
  std::map<std::string, detail::ShardedRef> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (const auto ref = detail::sharded_ref(item.value())) out[item.key()] = ref;
  }
  return out;
}

/// The rows [first, first + n) of a tensor whose full shape is `sizes`, put together from
/// every saved rank's part (`parts[s]` holds rows [firsts[s], firsts[s] + counts[s])).
at::Tensor rows_from(const std::vector<at::Tensor>& parts, const std::vector<int64_t>& firsts,
                     const std::vector<int64_t>& counts, int64_t first, int64_t n,
                     const std::vector<int64_t>& shard_sizes, const std::string& what,
                     const std::string& where) {
  TORCH_INTERNAL_ASSERT(!parts.empty());
  at::Tensor out = at::empty(shard_sizes, parts[0].options());
  int64_t covered = 0;
  for (size_t s = 0; s < parts.size(); ++s) {
    const int64_t lo = std::max(first, firsts[s]);
    const int64_t hi = std::min(first + n, firsts[s] + counts[s]);
    if (hi <= lo) continue;
    const int64_t row = parts[s].numel() / std::max<int64_t>(1, counts[s]);
    out.reshape({n, row})
        .narrow(0, lo - first, hi - lo)
        .copy_(parts[s].reshape({counts[s], row}).narrow(0, lo - firsts[s], hi - lo));
    covered += hi - lo;
  }
  DDP_CHECK(covered == n, where, ": the saved shards of ", what, " cover ", covered, " of rows [",
            first, ", ", first + n, "); the folder is incomplete or corrupt.");
  return out;
}

/// An unpickled list of ints (a GenericList) as a vector.
std::vector<int64_t> int_list(const c10::IValue& v, const std::string& where) {
  DDP_CHECK(v.isList(), where, ": 'rows' entries should be lists of ints; the file is corrupt.");
  std::vector<int64_t> out;
  for (const auto& e : v.toListRef()) {
    DDP_CHECK(e.isInt(), where, ": 'rows' entries should be lists of ints; the file is corrupt.");
    out.push_back(e.toInt());
  }
  DDP_CHECK(out.size() >= 2, where, ": a 'rows' entry is too short; the file is corrupt.");
  return out;
}

}  // namespace

namespace detail {

void save_legacy_sharded_checkpoint(const std::string& dir, const Checkpoint& checkpoint) {
  DDP_CHECK(checkpoint.model() != nullptr, "save_sharded_checkpoint('", dir,
            "'): Checkpoint::model is null; expected the unwrapped model");
  DDP_CHECK(checkpoint.sampler() == nullptr && checkpoint.grad_scaler() == nullptr &&
                !checkpoint.sharded_optimizer(),
            "save_sharded_checkpoint('", dir,
            "'): a sharded checkpoint holds the model, the "
            "optimizer, the RNG states, epoch, step and extra; save the sampler, the grad "
            "scaler or a ZeroRedundancyOptimizer with ddp::save_checkpoint.");
  const CheckpointGroup group = checkpoint_group(checkpoint);
  std::string error;
  try {
    make_directories(dir);
    remove_file(dir + "/complete");
    c10::impl::GenericDict top = new_dict();
    top.insert("format", std::string(kShardedFormat));
    top.insert("version", kShardedVersion);
    top.insert("world_size", static_cast<int64_t>(group.size));
    top.insert("rank", static_cast<int64_t>(group.rank));
    top.insert("epoch", checkpoint.epoch());
    top.insert("step", checkpoint.step());
    top.insert("model", cpu_state_dict(*checkpoint.model()));
    c10::impl::GenericDict rows = new_dict();
    for (const auto& [key, ref] : sharded_by_key(*checkpoint.model())) {
      const ShardedParam& p = *ref.param;
      std::vector<int64_t> info = {p.first_row(ref.unit->group().rank()), p.local_rows};
      info.insert(info.end(), p.sizes.begin(), p.sizes.end());
      rows.insert(key, c10::List<int64_t>(info));
    }
    top.insert("rows", rows);
    if (checkpoint.optimizer() != nullptr) {
      top.insert("optimizer", optimizer_state_dict(*checkpoint.optimizer(), *checkpoint.model()));
    }
    if (checkpoint.rng()) top.insert("rng", rng_state());
    top.insert("extra", checkpoint.extra());
    const std::vector<char> bytes = pickle(top);
    write_file_atomic(shard_file(dir, group.rank, group.size),
                      std::string_view(bytes.data(), bytes.size()));
  } catch (const c10::Error& e) {
    error = e.msg();
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Every rank learns whether every file is there before rank 0 marks the folder done.
  std::vector<std::string> verdicts = group.all_gather(error);
  std::string first;
  for (size_t r = 0; r < verdicts.size() && first.empty(); ++r) {
    if (!verdicts[r].empty()) first = "rank " + std::to_string(r) + ": " + verdicts[r];
  }
  if (first.empty() && group.rank == 0) {
    try {
      write_file_atomic(dir + "/complete", std::to_string(group.size) + "\n");
    } catch (const std::exception& e) {
      first = std::string("rank 0: ") + e.what();
    }
  }
  verdicts = group.all_gather(group.rank == 0 ? first : "");
  DDP_CHECK(verdicts[0].empty(), "save_sharded_checkpoint('", dir,
            "') failed, so the folder is not marked complete; ", verdicts[0]);
}

void load_legacy_sharded_checkpoint(const std::string& dir, Checkpoint& checkpoint) {
  const CheckpointGroup group = checkpoint_group(checkpoint);
  const std::string where = "load_sharded_checkpoint('" + dir + "')" +
                            (group.size > 1 ? " on rank " + std::to_string(group.rank) : "");
  DDP_CHECK(checkpoint.model() != nullptr, where,
            ": Checkpoint::model is null; expected the unwrapped model");
  DDP_CHECK(checkpoint.sampler() == nullptr && checkpoint.grad_scaler() == nullptr &&
                !checkpoint.sharded_optimizer(),
            where,
            ": a sharded checkpoint holds no sampler, grad scaler or "
            "ZeroRedundancyOptimizer state; load those from a ddp::save_checkpoint file.");
  DDP_CHECK(file_exists(dir + "/complete"), where,
            ": the folder has no 'complete' mark, so "
            "its save did not finish (or it is not a sharded checkpoint). Expected a folder "
            "written by ddp::save_sharded_checkpoint.");
  const std::string mark = read_file(dir + "/complete");
  int64_t saved_world = 0;
  try {
    saved_world = std::stoll(mark);
  } catch (const std::exception&) {
  }
  DDP_CHECK(saved_world > 0, where, ": 'complete' should hold the saved world size, but holds '",
            mark, "'; the folder is corrupt.");

  std::vector<c10::impl::GenericDict> files;
  for (int64_t s = 0; s < saved_world; ++s) {
    const std::string path = shard_file(dir, s, saved_world);
    DDP_CHECK(file_exists(path), where, ": ", path, " is missing; the folder is incomplete.");
    c10::impl::GenericDict top = as_dict(unpickle(read_file(path), where), path, where);
    const auto format = top.find("format");
    DDP_CHECK(format != top.end() && format->value().isString() &&
                  format->value().toStringRef() == kShardedFormat,
              where, ": ", path, " is not a ddp-cpp sharded checkpoint file.");
    DDP_CHECK(get_int(top, "version", path, where) <= kShardedVersion, where, ": ", path,
              " has a newer format version than this library reads; update ddp-cpp.");
    files.push_back(top);
  }
  const c10::impl::GenericDict& first = files[0];

  // The model: this rank's rows of each sharded key, from every saved rank's.
  std::vector<c10::Dict<std::string, at::Tensor>> models;
  std::vector<c10::impl::GenericDict> rows_of;
  for (const auto& f : files) {
    models.push_back(tensor_dict(get(f, "model", "the file", where), "'model'", where));
    rows_of.push_back(as_dict(get(f, "rows", "the file", where), "'rows'", where));
  }
  const auto sharded = sharded_by_key(*checkpoint.model());
  // Saved rows of `key`: per saved rank, its first row and count.
  auto saved_rows = [&](const std::string& key, std::vector<int64_t>& firsts,
                        std::vector<int64_t>& counts) {
    for (const auto& r : rows_of) {
      const auto it = r.find(key);
      DDP_CHECK(it != r.end(), where, ": the model's parameter '", key,
                "' is sharded here, but was not sharded when saved; load a checkpoint saved "
                "under fully_shard, or a ddp::save_checkpoint file.");
      const auto info = int_list(it->value(), where);
      firsts.push_back(info.at(0));
      counts.push_back(info.at(1));
    }
  };
  c10::Dict<std::string, at::Tensor> model_state;
  for (const auto& kv : models[0]) {
    const auto it = sharded.find(kv.key());
    if (it == sharded.end()) {
      const auto saved_info = rows_of[0].find(kv.key());
      if (saved_info == rows_of[0].end()) {
        model_state.insert(kv.key(), kv.value());
        continue;
      }
      // Sharded when saved, whole here (a model without fully_shard): every row.
      const auto info = int_list(saved_info->value(), where);
      const std::vector<int64_t> sizes(info.begin() + 2, info.end());
      std::vector<int64_t> firsts, counts, shape = sizes;
      saved_rows(kv.key(), firsts, counts);
      std::vector<at::Tensor> parts;
      for (const auto& m : models) parts.push_back(m.at(kv.key()));
      const int64_t rows = sizes.empty() ? 1 : sizes[0];
      if (shape.empty()) shape = {1};
      model_state.insert(kv.key(), rows_from(parts, firsts, counts, 0, rows, shape,
                                             "'" + kv.key() + "'", where)
                                       .reshape(sizes));
      continue;
    }
    const ShardedParam& p = *it->second.param;
    std::vector<int64_t> firsts, counts;
    saved_rows(kv.key(), firsts, counts);
    std::vector<at::Tensor> parts;
    for (const auto& m : models) parts.push_back(m.at(kv.key()));
    model_state.insert(kv.key(),
                       rows_from(parts, firsts, counts,
                                 p.first_row(it->second.unit->group().rank()), p.local_rows,
                                 p.shard_sizes(p.local_rows), "'" + kv.key() + "'", where));
  }
  std::vector<Apply> steps;
  steps.push_back(prepare_model_load(*checkpoint.model(), model_state, where));

  if (checkpoint.optimizer() != nullptr) {
    DDP_CHECK(first.contains("optimizer"), where,
              ": the checkpoint has no optimizer state; "
              "load with Checkpoint::optimizer(nullptr) to skip it.");
    c10::impl::GenericDict opt = as_dict(first.at("optimizer"), "'optimizer'", where).copy();
    const auto names = get(opt, "param_names", "'optimizer'", where).toListRef();
    c10::impl::GenericDict state =
        as_dict(get(opt, "state", "'optimizer'", where), "'optimizer'['state']", where).copy();
    for (const auto& entry : as_dict(opt.at("state"), "'state'", where)) {
      const int64_t i = entry.key().toInt();
      const std::string key = i < static_cast<int64_t>(names.size()) && names[i].isString()
                                  ? names[i].toStringRef()
                                  : std::string();
      const auto it = sharded.find(key);
      if (it == sharded.end()) continue;
      const ShardedParam& p = *it->second.param;
      std::vector<int64_t> firsts, counts;
      saved_rows(key, firsts, counts);
      c10::impl::GenericDict values = entry.value().toGenericDict().copy();
      for (const auto& kv : entry.value().toGenericDict()) {
        if (!kv.value().isTensor() || kv.value().toTensor().dim() == 0) continue;
        std::vector<at::Tensor> parts;
        for (const auto& f : files) {
          const auto st = f.at("optimizer").toGenericDict().at("state").toGenericDict();
          parts.push_back(st.at(entry.key()).toGenericDict().at(kv.key()).toTensor());
        }
        values.insert_or_assign(kv.key(), rows_from(parts, firsts, counts,
                                                    p.first_row(it->second.unit->group().rank()),
                                                    p.local_rows, p.shard_sizes(p.local_rows),
                                                    "the optimizer state of '" + key + "'", where));
      }
      state.insert_or_assign(entry.key(), values);
    }
    opt.insert_or_assign("state", state);
    steps.push_back(
        prepare_optimizer_load(*checkpoint.optimizer(), *checkpoint.model(), opt, where));
  }
  if (checkpoint.rng()) {
    // This rank's state at the same world size; else rank r takes r % saved ranks.
    const auto& f = files[static_cast<size_t>(group.rank % saved_world)];
    DDP_CHECK(f.contains("rng"), where,
              ": the checkpoint has no RNG states; load with "
              "Checkpoint::rng(false) to skip them.");
    steps.push_back(prepare_rng_load(f.at("rng"), "rng", where));
  }
  for (const Apply& apply : steps) apply();
  CheckpointExtra extra(c10::StringType::get(), c10::AnyType::get());
  for (const auto& e : as_dict(get(first, "extra", "the file", where), "'extra'", where)) {
    extra.insert(e.key(), e.value());
  }
  checkpoint.epoch(get_int(first, "epoch", "the file", where))
      .step(get_int(first, "step", "the file", where))
      .extra(extra);
}

}  // namespace detail

void save_sharded_checkpoint(const std::string& dir, const Checkpoint& checkpoint) {
  detail::save_dcp_checkpoint(dir, checkpoint, nullptr);
}

void load_sharded_checkpoint(const std::string& dir, Checkpoint& checkpoint) {
  if (detail::file_exists(dir + "/.metadata")) {
    detail::load_dcp_checkpoint(dir, checkpoint);
  } else if (detail::file_exists(dir + "/complete")) {
    detail::load_legacy_sharded_checkpoint(dir, checkpoint);
  } else {
    DDP_CHECK(false, "load_checkpoint('", dir, "'): the folder has no .metadata",
              detail::is_directory(dir) ? "" : " (it does not exist)",
              ", so it is not a checkpoint, or its save did not finish. Expected a folder "
              "written by ddp::save_sharded_checkpoint or by ddp::save_checkpoint with "
              "CheckpointFormat::kDcp; ddp::latest_checkpoint(options) finds the newest "
              "complete one.");
  }
}

}  // namespace ddp
