#pragma once

#include <ddp/serialize/checkpoint.h>

#include "formats/pickle_io.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp {
namespace detail {

/// The group a checkpoint call synchronises with: Checkpoint::process_group, else the
/// default group, else this process alone.
struct CheckpointGroup {
  std::shared_ptr<ProcessGroup> owned;  // keeps the group alive during the call
  ProcessGroup* group = nullptr;
  int rank = 0;
  int size = 1;
  /// Every rank's bytes, in rank order.
  std::vector<std::string> all_gather(const std::string& bytes) const;
};
CheckpointGroup checkpoint_group(const Checkpoint& checkpoint);

/// save_checkpoint with work that rank 0 does just before writing (`before`) and just
/// after the file is complete (`after`); a failure in either fails the save everywhere.
void save_checkpoint_with(const std::string& path, const Checkpoint& checkpoint,
                          const std::function<void()>& before, const std::function<void()>& after);

/// What only this rank knows (its sampler position, RNG states, PowerSGD state), pickled,
/// for checkpoint_entries on every rank's parts.
std::string rank_part(const Checkpoint& checkpoint);

/// A checkpoint's entries other than "model" and "optimizer": format, version,
/// world_size, epoch, step, sampler, rng, powersgd, scaler and extra, from every rank's
/// rank_part (in rank order). The same in the single file and in a DCP folder.
c10::impl::GenericDict checkpoint_entries(const Checkpoint& checkpoint,
                                          const CheckpointGroup& group,
                                          const std::vector<std::string>& parts);

/// Those entries checked (format, version, what the Checkpoint asks to restore) and their
/// loads prepared; nothing changes until `steps` run (Note [Validate, then apply]).
struct PreparedEntries {
  int64_t epoch = 0;
  int64_t step = 0;
  CheckpointExtra extra = CheckpointExtra(c10::StringType::get(), c10::AnyType::get());
  std::vector<Apply> steps;
};
PreparedEntries prepare_entries_load(const Checkpoint& checkpoint, const CheckpointGroup& group,
                                     const c10::impl::GenericDict& top, bool optimizer_saved,
                                     const std::string& where);

/// A checkpoint as a DCP folder (Note [Checkpoints in DCP folders]): collective over the
/// checkpoint's group; `after` runs on rank 0 once the folder is complete, and a failure
/// there fails the save on every rank.
void save_dcp_checkpoint(const std::string& dir, const Checkpoint& checkpoint,
                         const std::function<void()>& after);
void load_dcp_checkpoint(const std::string& dir, Checkpoint& checkpoint);

/// The sharded folder of the first format (shard-<r>-of-<N>.pt and `complete`), which
/// load_sharded_checkpoint still reads; kept to test that.
void save_legacy_sharded_checkpoint(const std::string& dir, const Checkpoint& checkpoint);
void load_legacy_sharded_checkpoint(const std::string& dir, Checkpoint& checkpoint);

}  // namespace detail
}  // namespace ddp
