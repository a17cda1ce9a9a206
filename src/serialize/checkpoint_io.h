#pragma once

#include <ddp/serialize/checkpoint.h>

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

}  // namespace detail
}  // namespace ddp
