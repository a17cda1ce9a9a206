// save_checkpoint / load_checkpoint for one file. See include/ddp/serialize/checkpoint.h for the
// file layout.

#include <ddp/serialize/checkpoint.h>

#include <ddp/parallel/powersgd.h>

#include <ddp/amp/grad_scaler.h>
#include <ddp/fsdp/fully_shard.h>
#include <ddp/optim/zero_redundancy_optimizer.h>
#include <ddp/parallel/tensor_parallel.h>

#include "amp/scaler_state.h"
#include "distributed/common/check.h"
#include "data/reshard.h"
#include "formats/atomic_file.h"
#include "serialize/checkpoint_io.h"
#include "formats/optimizer_state.h"
#include "formats/pickle_io.h"
#include "formats/rng_state.h"
#include "serialize/state_dict.h"
#include "fsdp/sharded_model.h"
#include "optim/zero_state.h"
#include "formats/sharded_state.h"

#include <c10/util/Exception.h>
#include <torch/nn/module.h>

namespace ddp {
namespace detail {

namespace {

constexpr const char* kFormat = "ddp-cpp checkpoint";
constexpr int64_t kVersion = 1;

// The single file holds whole tensors, gathered on rank 0; a tensor-parallel model's
// chunks (and its optimizer's) are not gathered there yet.
void check_no_tensor_parallel(const torch::nn::Module& model, const std::string& where) {
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    DDP_CHECK(!tensor_parallel_shard(p.value()), where, ": '", p.key(),
              "' is split by ddp::parallelize_module; a checkpoint file holds whole tensors. "
              "Save tensor-parallel models as DCP folders (ddp::save_sharded_checkpoint, or "
              "CheckpointOptions::format(ddp::CheckpointFormat::kDcp)), which every rank "
              "writes its chunks to, or ddp::full_state_dict for the model alone.");
  }
}

}  // namespace

// What only this rank knows: its sampler position and its RNG states.
std::string rank_part(const Checkpoint& checkpoint) {
  c10::impl::GenericDict part = new_dict();
  if (checkpoint.sampler() != nullptr) {
    part.insert("sampler_rank", checkpoint.sampler()->rank());
    part.insert("position", static_cast<int64_t>(checkpoint.sampler()->position()));
  }
  if (checkpoint.rng()) part.insert("rng", rng_state());
  if (checkpoint.powersgd() != nullptr) {
    part.insert("powersgd", checkpoint.powersgd()->state_dict(*checkpoint.model()));
  }
  return pickle_string(part);
}

namespace {

c10::impl::GenericDict sampler_dict(const DistributedSampler& sampler,
                                    const std::vector<c10::impl::GenericDict>& parts) {
  const DistributedSamplerState st = sampler.state();
  // Positions are indexed by sampler rank; -1 where no process had that rank.
  std::vector<int64_t> positions(static_cast<size_t>(st.num_replicas), -1);
  for (const auto& part : parts) {
    const int64_t r = part.at("sampler_rank").toInt();
    if (r >= 0 && r < st.num_replicas) positions[r] = part.at("position").toInt();
  }
  c10::impl::GenericDict d = new_dict();
  d.insert("epoch", st.epoch);
  d.insert("dataset_size", st.dataset_size);
  d.insert("num_replicas", st.num_replicas);
  d.insert("shuffle", st.shuffle);
  d.insert("seed", st.seed);
  d.insert("drop_last", st.drop_last);
  d.insert("positions", c10::List<int64_t>(positions));
  if (!st.earlier_stages.empty()) {  // Note [Re-sharding an epoch] in src/data/reshard.h
    c10::impl::GenericList stages = new_list();
    for (const DistributedSamplerStage& stage : st.earlier_stages) {
      c10::impl::GenericDict sd = new_dict();
      sd.insert("num_replicas", stage.num_replicas);
      sd.insert("positions", c10::List<int64_t>(stage.positions));
      stages.push_back(sd);
    }
    d.insert("earlier_stages", stages);
  }
  return d;
}

}  // namespace

c10::impl::GenericDict checkpoint_entries(const Checkpoint& checkpoint,
                                          const CheckpointGroup& group,
                                          const std::vector<std::string>& part_bytes) {
  std::vector<c10::impl::GenericDict> parts;
  for (size_t r = 0; r < part_bytes.size(); ++r) {
    parts.push_back(as_dict(unpickle(part_bytes[r], "save_checkpoint"),
                            "rank " + std::to_string(r) + "'s part", "save_checkpoint"));
  }
  c10::impl::GenericDict top = new_dict();
  top.insert("format", std::string(kFormat));
  top.insert("version", kVersion);
  top.insert("world_size", static_cast<int64_t>(group.size));
  top.insert("epoch", checkpoint.epoch());
  top.insert("step", checkpoint.step());
  if (checkpoint.sampler() != nullptr) {
    top.insert("sampler", sampler_dict(*checkpoint.sampler(), parts));
  }
  if (checkpoint.rng()) {
    c10::impl::GenericList rng = new_list();
    for (const auto& part : parts) rng.push_back(part.at("rng"));
    top.insert("rng", rng);
  }
  if (checkpoint.powersgd() != nullptr) {
    c10::impl::GenericList states = new_list();
    for (const auto& part : parts) states.push_back(part.at("powersgd"));
    top.insert("powersgd", states);
  }
  if (checkpoint.grad_scaler() != nullptr) {
    // Rank 0's: the same on every rank (Note [Found-inf across ranks] in
    // src/amp/grad_scaler.cpp). Empty for a disabled scaler, as in Python.
    top.insert("scaler", checkpoint.grad_scaler()->state_dict());
  }
  top.insert("extra", checkpoint.extra());
  return top;
}

namespace {

std::vector<char> build_file(const Checkpoint& checkpoint, const CheckpointGroup& group,
                             const std::vector<std::string>& part_bytes,
                             const std::optional<c10::impl::GenericDict>& sharded_state,
                             const std::optional<c10::Dict<std::string, at::Tensor>>& full_model) {
  // The file's keys in their order: format, version, world_size, epoch, step, model,
  // optimizer, then the rest.
  const c10::impl::GenericDict entries = checkpoint_entries(checkpoint, group, part_bytes);
  c10::impl::GenericDict top = new_dict();
  for (const char* key : {"format", "version", "world_size", "epoch", "step"}) {
    top.insert(key, entries.at(key));
  }
  top.insert("model", full_model ? *full_model : cpu_state_dict(*checkpoint.model()));
  DDP_CHECK(!checkpoint.sharded_optimizer() || sharded_state,
            "save_checkpoint: rank 0 of "
            "the checkpoint's group is not rank 0 of the ZeroRedundancyOptimizer's group, "
            "where its state was gathered. Use the optimizer's group for the checkpoint.");
  if (checkpoint.optimizer() != nullptr) {
    top.insert("optimizer",
               sharded_state ? sharded_state.value()
                             : optimizer_state_dict(*checkpoint.optimizer(), *checkpoint.model()));
  }
  for (const auto& e : entries) {
    if (!top.contains(e.key())) top.insert(e.key(), e.value());
  }
  return pickle(top);
}

Apply prepare_sampler_load(DistributedSampler& sampler, const c10::IValue& saved,
                           const std::string& where) {
  const std::string what = "'sampler'";
  const c10::impl::GenericDict d = as_dict(saved, what, where);
  DistributedSamplerState st;
  st.epoch = get_int(d, "epoch", what, where);
  st.dataset_size = get_int(d, "dataset_size", what, where);
  st.num_replicas = get_int(d, "num_replicas", what, where);
  st.shuffle = get_bool(d, "shuffle", what, where);
  st.seed = get_int(d, "seed", what, where);
  st.drop_last = get_bool(d, "drop_last", what, where);
  const std::vector<int64_t> positions = get_int_list(d, "positions", what, where);
  if (d.contains("earlier_stages")) {
    const c10::IValue stages = d.at("earlier_stages");
    DDP_CHECK(stages.isList(), where, ": sampler['earlier_stages'] should be a list");
    for (const c10::IValue& sv : stages.toList()) {
      const c10::impl::GenericDict sd = as_dict(sv, "sampler['earlier_stages'][i]", where);
      DistributedSamplerStage stage;
      stage.num_replicas = get_int(sd, "num_replicas", "sampler['earlier_stages'][i]", where);
      stage.positions = get_int_list(sd, "positions", "sampler['earlier_stages'][i]", where);
      st.earlier_stages.push_back(std::move(stage));
    }
  }
  DDP_CHECK(static_cast<int64_t>(positions.size()) == st.num_replicas && st.num_replicas > 0 &&
                st.dataset_size > 0,
            where, ": sampler['positions'] has ", positions.size(),
            " entries for num_replicas=", st.num_replicas, "; the file is corrupt.");

  if (st.num_replicas == sampler.num_replicas()) {
    st.rank = sampler.rank();
    st.position = positions[static_cast<size_t>(st.rank)];
    DDP_CHECK(st.position >= 0, where, ": no rank saved a position for sampler rank ", st.rank,
              "; the checkpoint was saved with a sampler of another rank layout.");
  } else {
    // Note [Resuming with another world size]: at an epoch boundary (every rank at 0, or
    // every rank done with the epoch) the epoch carries over. Mid-epoch the samples that
    // the saved ranks had not handed out are shared among this run's ranks (Note
    // [Re-sharding an epoch] in src/data/reshard.h), which needs every saved position.
    const size_t saved_samples =
        detail::samples_per_rank(static_cast<size_t>(st.dataset_size), st.earlier_stages,
                                 st.num_replicas, st.drop_last);
    // -1: no process had that sampler rank (e.g. saved by one process for rank 0 of 2).
    bool all_zero = true;
    bool all_done = true;
    bool all_known = true;
    for (const int64_t p : positions) {
      all_known = all_known && p >= 0;
      if (p < 0) continue;
      all_zero = all_zero && p == 0;
      all_done = all_done && p == static_cast<int64_t>(saved_samples);
    }
    const int64_t epoch = st.epoch;
    std::vector<DistributedSamplerStage> stages = st.earlier_stages;
    if (!all_zero && !all_done) {
      DDP_CHECK(all_known, where, ": the checkpoint was saved mid-epoch (epoch ", epoch, ") by ",
                st.num_replicas,
                " ranks, but not every rank saved its sampler "
                "position, so the samples not yet seen are unknown and cannot be shared among "
                "this run's ",
                sampler.num_replicas(), " ranks. Resume with ", st.num_replicas,
                " ranks, or from a checkpoint saved at an epoch boundary.");
      stages.push_back(DistributedSamplerStage{st.num_replicas, positions});
    }
    st = sampler.state();
    st.epoch = epoch;
    st.earlier_stages = all_done ? std::vector<DistributedSamplerStage>() : stages;
    st.position = 0;
    if (all_done) {  // nothing left of that epoch: the loop goes on to the next
      st.position =
          static_cast<int64_t>(detail::samples_per_rank(static_cast<size_t>(st.dataset_size), {},
                                                        st.num_replicas, st.drop_last));
    }
  }
  sampler.check_state(st);
  return [&sampler, st] { sampler.load_state(st); };
}

// A checkpoint without "scaler" (saved before mixed precision was on, or without
// Checkpoint::grad_scaler) or with an empty one (a disabled scaler) leaves the scaler as
// it is: resuming may switch mixed precision on. A disabled scaler ignores the state.
Apply prepare_scaler_load(amp::GradScaler& scaler, const c10::impl::GenericDict& top,
                          const std::string& where) {
  const auto it = top.find("scaler");
  if (it == top.end() || !scaler.is_enabled()) return [] {};
  const c10::impl::GenericDict d = as_dict(it->value(), "'scaler'", where);
  if (d.size() == 0) return [] {};
  amp::detail::parse_scaler_state(d, where);  // validates; load_state_dict applies
  return [&scaler, d] { scaler.load_state_dict(d); };
}

}  // namespace

std::vector<std::string> CheckpointGroup::all_gather(const std::string& bytes) const {
  if (group == nullptr || size == 1) return {bytes};
  return group->all_gather_bytes(bytes);
}

CheckpointGroup checkpoint_group(const Checkpoint& checkpoint) {
  CheckpointGroup g;
  if (checkpoint.process_group() != nullptr) {
    g.owned = checkpoint.process_group();
  } else if (is_initialized()) {
    g.owned = default_group();
  }
  g.group = g.owned.get();
  if (g.group != nullptr) {
    g.rank = g.group->rank();
    g.size = g.group->size();
  }
  return g;
}

// Note [Save barrier]
// Rank 0 writes; the others must not return (and perhaps read the file, or exit and let
// a launcher count the job as done) before the file is complete. Instead of a bare
// barrier, every rank waits for rank 0's verdict: "" when the file is complete, else
// rank 0's error, which every rank then throws, so no rank carries on believing a
// checkpoint exists.
void save_checkpoint_with(const std::string& path, const Checkpoint& checkpoint,
                          const std::function<void()>& before, const std::function<void()>& after) {
  DDP_CHECK(checkpoint.model() != nullptr, "save_checkpoint('", path,
            "'): Checkpoint::model is null; expected the unwrapped model");
  check_no_tensor_parallel(*checkpoint.model(), "save_checkpoint('" + path + "')");
  const CheckpointGroup group = checkpoint_group(checkpoint);
  // Note [Sharded optimizers in checkpoints]: gathered on rank 0, with every rank.
  std::optional<c10::impl::GenericDict> sharded_state =
      checkpoint.sharded_optimizer() ? checkpoint.sharded_optimizer()->gather(*checkpoint.model())
                                     : std::nullopt;
  // Note [Sharded models in checkpoints]: gathered on rank 0 too, with every rank.
  std::optional<c10::Dict<std::string, at::Tensor>> full_model;
  if (model_is_sharded(*checkpoint.model())) {
    full_model = full_state_dict(*checkpoint.model());
    if (checkpoint.optimizer() != nullptr && !checkpoint.sharded_optimizer()) {
      sharded_state = gather_optimizer_state(*checkpoint.optimizer(), *checkpoint.model());
    }
  }
  const std::vector<std::string> parts = group.all_gather(rank_part(checkpoint));
  std::string error;
  if (group.rank == 0) {
    try {
      const std::vector<char> bytes =
          build_file(checkpoint, group, parts, sharded_state, full_model);
      if (before) before();
      write_file_atomic(path, std::string_view(bytes.data(), bytes.size()));
      if (after) after();
    } catch (const c10::Error& e) {
      error = e.msg();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const std::vector<std::string> verdicts = group.all_gather(group.rank == 0 ? error : "");
  DDP_CHECK(verdicts[0].empty(), "save_checkpoint('", path,
            "') failed on rank 0 (the rank "
            "that writes), so no checkpoint was written; seen on rank ",
            group.rank, ": ", verdicts[0]);
}

}  // namespace detail

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint) {
  detail::save_checkpoint_with(path, checkpoint, nullptr, nullptr);
}

namespace detail {

PreparedEntries prepare_entries_load(const Checkpoint& checkpoint, const CheckpointGroup& group,
                                     const c10::impl::GenericDict& top, bool optimizer_saved,
                                     const std::string& where) {
  const auto format = top.find("format");
  DDP_CHECK(format != top.end() && format->value().isString() &&
                format->value().toStringRef() == kFormat,
            where, ": not a ddp-cpp checkpoint (",
            format == top.end()          ? std::string("it has no 'format' key")
            : format->value().isString() ? "its format is '" + format->value().toStringRef() + "'"
                                         : "its format is a " + format->value().tagKind(),
            "). For a plain state dict, such as torch.save(model.state_dict()) writes, use "
            "ddp::read_state_dict; for a DCP checkpoint that Python's dcp.save wrote, "
            "ddp::dcp::load.");
  const int64_t version = get_int(top, "version", "the checkpoint", where);
  DDP_CHECK(version <= kVersion, where, ": checkpoint format version ", version,
            " is newer than this library reads (", kVersion, "); update ddp-cpp.");
  PreparedEntries out;
  out.epoch = get_int(top, "epoch", "the checkpoint", where);
  out.step = get_int(top, "step", "the checkpoint", where);
  const int64_t world_size = get_int(top, "world_size", "the checkpoint", where);
  const c10::impl::GenericDict extra_generic =
      as_dict(get(top, "extra", "the checkpoint", where), "'extra'", where);
  for (const auto& entry : extra_generic) {
    DDP_CHECK(entry.key().isString(), where, ": 'extra' should have string keys");
    out.extra.insert(entry.key(), entry.value());
  }

  auto require = [&](const char* key, const char* setter) {
    DDP_CHECK(top.contains(key), where, ": the checkpoint has no '", key,
              "' (it was saved without Checkpoint::", setter,
              "), but this Checkpoint asks "
              "to restore one. Load with Checkpoint::",
              setter, key == std::string("rng") ? "(false)" : "(nullptr)", " to skip it.");
  };
  DDP_CHECK(checkpoint.optimizer() == nullptr || optimizer_saved, where,
            ": the checkpoint has no 'optimizer' (it was saved without Checkpoint::optimizer), "
            "but this Checkpoint asks to restore one. Load with Checkpoint::optimizer(nullptr) "
            "to skip it.");
  if (checkpoint.sampler() != nullptr) require("sampler", "sampler");
  if (checkpoint.rng()) require("rng", "rng");
  if (checkpoint.powersgd() != nullptr) require("powersgd", "powersgd");

  std::vector<Apply>& steps = out.steps;
  if (checkpoint.sampler() != nullptr) {
    steps.push_back(prepare_sampler_load(*checkpoint.sampler(),
                                         get(top, "sampler", "the checkpoint", where), where));
  }
  if (checkpoint.grad_scaler() != nullptr) {
    steps.push_back(prepare_scaler_load(*checkpoint.grad_scaler(), top, where));
  }
  if (checkpoint.rng()) {
    const c10::IValue rng_value = get(top, "rng", "the checkpoint", where);
    DDP_CHECK(rng_value.isList() && rng_value.toList().size() > 0, where,
              ": 'rng' should be a non-empty list (one entry per rank)");
    const c10::impl::GenericList rng = rng_value.toList();
    // Same world size: each rank its own state; else rank r takes r % saved ranks.
    DDP_CHECK(world_size != group.size || static_cast<int64_t>(rng.size()) == world_size, where,
              ": 'rng' has ", rng.size(), " entries for world_size=", world_size,
              "; the checkpoint is corrupt.");
    const size_t index = static_cast<size_t>(group.rank) % rng.size();
    steps.push_back(prepare_rng_load(rng.get(index), "rng[" + std::to_string(index) + "]", where));
  }
  if (checkpoint.powersgd() != nullptr) {
    const c10::IValue value = get(top, "powersgd", "the checkpoint", where);
    DDP_CHECK(value.isList() && static_cast<int64_t>(value.toList().size()) == world_size, where,
              ": 'powersgd' should be a list with one entry per rank (", world_size,
              "); the checkpoint is corrupt.");
    DDP_CHECK(world_size == group.size, where, ": the PowerSGD state was saved by ", world_size,
              " ranks and is loaded by ", group.size,
              "; its error feedback is each rank's own. Resume with ", world_size,
              " ranks, or load without Checkpoint::powersgd (compression then starts afresh).");
    // Validated on a copy (load_state_dict throws before it changes anything); applied
    // with the rest.
    auto staged = std::make_shared<PowerSGDState>(*checkpoint.powersgd());
    staged->load_state_dict(as_dict(value.toList().get(static_cast<size_t>(group.rank)),
                                    "'powersgd'", where),
                            *checkpoint.model());
    PowerSGDState* target = checkpoint.powersgd();
    steps.push_back([staged, target] { *target = *staged; });
  }
  return out;
}

}  // namespace detail

void load_checkpoint(const std::string& path, Checkpoint& checkpoint) {
  using namespace detail;
  if (is_directory(path)) {  // a DCP folder (or a sharded folder of the older format)
    load_sharded_checkpoint(path, checkpoint);
    return;
  }
  const CheckpointGroup group = checkpoint_group(checkpoint);
  const std::string where = "load_checkpoint('" + path + "')" +
                            (group.size > 1 ? " on rank " + std::to_string(group.rank) : "");
  DDP_CHECK(checkpoint.model() != nullptr, where,
            ": Checkpoint::model is null; expected the unwrapped model");
  DDP_CHECK(file_exists(path), where,
            ": no such file. Expected a checkpoint written by "
            "ddp::save_checkpoint; ddp::latest_checkpoint(options) finds the newest one.");
  check_no_tensor_parallel(*checkpoint.model(), where);
  const c10::impl::GenericDict top =
      as_dict(unpickle(read_file(path), where), "the file's content", where);
  // Note [Validate, then apply]
  PreparedEntries entries =
      prepare_entries_load(checkpoint, group, top, top.contains("optimizer"), where);
  std::vector<Apply> steps;
  // Note [Sharded models in checkpoints]: this rank's rows of the full tensors.
  const bool sharded = model_is_sharded(*checkpoint.model());
  c10::Dict<std::string, at::Tensor> model_state =
      tensor_dict(get(top, "model", "the file", where), "'model'", where);
  if (sharded) model_state = shard_model_state(*checkpoint.model(), model_state);
  steps.push_back(prepare_model_load(*checkpoint.model(), model_state, where));
  if (checkpoint.optimizer() != nullptr) {
    c10::IValue saved = get(top, "optimizer", "the file", where);
    if (sharded && !checkpoint.sharded_optimizer()) {
      saved = shard_optimizer_state(*checkpoint.optimizer(), saved);
    }
    steps.push_back(
        checkpoint.sharded_optimizer()
            ? checkpoint.sharded_optimizer()->prepare_load(*checkpoint.model(), saved, where)
            : prepare_optimizer_load(*checkpoint.optimizer(), *checkpoint.model(), saved, where));
  }
  for (const Apply& apply : steps) apply();
  for (const Apply& apply : entries.steps) apply();
  checkpoint.epoch(entries.epoch).step(entries.step).extra(entries.extra);
}

Checkpoint& Checkpoint::optimizer(ZeroRedundancyOptimizer* optimizer) {
  optimizer_ = optimizer;
  sharded_optimizer_ =
      optimizer == nullptr ? nullptr : detail::make_zero_checkpoint_state(*optimizer);
  return *this;
}

}  // namespace ddp
