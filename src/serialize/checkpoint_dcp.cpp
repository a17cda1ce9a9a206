// A Checkpoint as a DCP folder: save_sharded_checkpoint, and save_checkpoint with
// CheckpointFormat::kDcp.
//
// Note [Checkpoints in DCP folders]
// The folder is a checkpoint of PyTorch's Distributed Checkpoint format (ddp/serialize/
// dcp.h) holding what the single file holds, under the same names:
//   "model.<name>"      the model's state dict; a fully_shard parameter written as each
//                       rank's rows, nothing gathered
//   "optimizer.state.<name>.<exp_avg|...>", "optimizer.param_groups.<i>.<lr|...>"
//                       the optimizer in get_optimizer_state_dict's layout (a
//                       ZeroRedundancyOptimizer's state by the rank that steps it)
//   "format", "version", "world_size", "epoch", "step", "sampler", "rng", "powersgd",
//   "scaler", "extra"   objects, as in the file (per-rank values gathered into lists of
//                       a few kilobytes; rank 0 writes them)
// So Python's dcp.load({"model": model.state_dict(), "optimizer": ...}) reads the model and
// optimizer of a C++ run, dcp_to_torch_save turns the folder into the dict torch.load
// gives for the single file, and the loading side reshards to any world size. Loading
// reads and checks every object first (the sampler, RNG and scaler loads are prepared,
// Note [Validate, then apply]), then dcp::load stages and checks every tensor before it
// copies any; only then are the prepared loads applied. A failure anywhere before that
// leaves the model, optimizer, sampler and RNG as they were.

#include <ddp/serialize/checkpoint.h>
#include <ddp/serialize/dcp.h>

#include "distributed/common/check.h"
#include "formats/atomic_file.h"
#include "serialize/checkpoint_io.h"

#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <set>

namespace ddp {
namespace detail {

namespace {

constexpr const char* kModelPrefix = "model";
constexpr const char* kOptimizerPrefix = "optimizer";

// The objects a checkpoint may hold, in the file's order.
constexpr const char* kEntryKeys[] = {"format",  "version", "world_size", "epoch",  "step",
                                      "sampler", "rng",     "powersgd",   "scaler", "extra"};

std::string error_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->msg();
  return e.what();
}

}  // namespace

void save_dcp_checkpoint(const std::string& dir, const Checkpoint& checkpoint,
                         const std::function<void()>& after) {
  DDP_CHECK(checkpoint.model() != nullptr, "save_checkpoint('", dir,
            "'): Checkpoint::model is null; expected the unwrapped model");
  const CheckpointGroup group = checkpoint_group(checkpoint);
  const std::vector<std::string> parts = group.all_gather(rank_part(checkpoint));
  dcp::StateDict state;
  if (group.rank == 0) {  // objects are rank 0's to write (Note [DCP save])
    for (const auto& entry : checkpoint_entries(checkpoint, group, parts)) {
      state.add_object(entry.key().toStringRef(), entry.value());
    }
  }
  state.add_model(*checkpoint.model(), kModelPrefix);
  if (checkpoint.optimizer() != nullptr) {
    state.add_optimizer(*checkpoint.optimizer(), *checkpoint.model(), kOptimizerPrefix);
  }
  // A sharded folder of the first format turns into a DCP one: its mark goes first, so
  // that a crash during this save leaves it refused, not read as the old checkpoint.
  if (group.rank == 0) remove_file(dir + "/complete");
  dcp::save(state, dir, dcp::SaveOptions().process_group(group.owned));
  if (!after) return;
  std::string error;
  if (group.rank == 0) {
    try {
      after();
    } catch (const std::exception& e) {
      error = error_of(e);
    }
  }
  const std::vector<std::string> verdicts = group.all_gather(error);
  DDP_CHECK(verdicts[0].empty(), "save_checkpoint('", dir,
            "'): the folder is complete, but rank 0 failed to record it; seen on rank ", group.rank,
            ": ", verdicts[0]);
}

void load_dcp_checkpoint(const std::string& dir, Checkpoint& checkpoint) {
  const CheckpointGroup group = checkpoint_group(checkpoint);
  const std::string where = "load_checkpoint('" + dir + "')" +
                            (group.size > 1 ? " on rank " + std::to_string(group.rank) : "");
  DDP_CHECK(checkpoint.model() != nullptr, where,
            ": Checkpoint::model is null; expected the unwrapped model");
  const std::vector<std::string> keys = dcp::checkpoint_keys(dir);
  const std::set<std::string> saved(keys.begin(), keys.end());

  // The objects first: read, checked, their loads prepared.
  dcp::StateDict objects;
  for (const char* key : kEntryKeys) {
    if (saved.count(key) > 0) objects.add_object(key, c10::IValue());
  }
  dcp::load(objects, dir);
  c10::impl::GenericDict top = new_dict();
  for (const std::string& key : objects.keys()) top.insert(key, objects.object(key));
  const std::string optimizer_keys = std::string(kOptimizerPrefix) + ".";
  const bool optimizer_saved = std::any_of(keys.begin(), keys.end(), [&](const std::string& k) {
    return k.compare(0, optimizer_keys.size(), optimizer_keys) == 0;
  });
  PreparedEntries entries = prepare_entries_load(checkpoint, group, top, optimizer_saved, where);

  // The tensors: every one staged and checked before any is copied, into this rank's
  // rows of each fully_shard parameter (and its optimizer state), at any world size.
  dcp::StateDict tensors;
  tensors.add_model(*checkpoint.model(), kModelPrefix);
  if (checkpoint.optimizer() != nullptr) {
    tensors.add_optimizer(*checkpoint.optimizer(), *checkpoint.model(), kOptimizerPrefix);
  }
  dcp::load(tensors, dir);
  for (const Apply& apply : entries.steps) apply();
  checkpoint.epoch(entries.epoch).step(entries.step).extra(entries.extra);
}

}  // namespace detail
}  // namespace ddp
