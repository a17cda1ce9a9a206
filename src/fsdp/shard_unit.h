#pragma once

// One fully_shard unit's parameters: their shards, the all-gather that makes them full,
// the reduce-scatter that shards their gradients (FSDP2's FSDPParamGroup). The schedule
// that calls these (when, and for which unit) is in fully_shard.cpp.
//
// Note [Shards in place]
// The module's parameter tensors keep their identity for the whole run: optimizers,
// state dicts, saved tensors and gradient accumulators all hold them. Only their data
// changes. At rest a parameter's data is this rank's rows (a view of the unit's flat
// shard, unpadded); for the unit's forward and backward it is the full tensor, a tensor
// of its own (`full`) whose storage is freed at reshard and allocated again, in the same
// StorageImpl, at the next all-gather. Views that autograd saved during forward (a
// weight's transpose, say) share that StorageImpl, so they see the values again when
// backward all-gathers before it uses them, and hold no memory in between: FSDP2's
// storage resize, on LibTorch's tensors.

#include <ddp/distributed/process_group.h>
#include <ddp/fsdp/fully_shard.h>

#include "distributed/common/host_blocks.h"
#include "modules/param_owners.h"
#include "distributed/work.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddp {
namespace detail {

struct ShardedParam {
  std::string name;                   // from the unit's module, as named_parameters() spells it
  at::Tensor param;                   // the module's tensor (Note [Shards in place])
  std::vector<int64_t> sizes;         // full
  at::ScalarType dtype = at::kFloat;  // the shard's (original) dtype
  int64_t rows = 0;                   // sizes[0] (1 for a scalar)
  int64_t row_numel = 1;              // elements per row
  int64_t chunk_rows = 0;             // ceil(rows / N): rows per rank, padded
  int64_t local_rows = 0;             // rows this rank holds (<= chunk_rows)
  int64_t offset = 0;                 // elements before it in a rank's flat shard
  bool requires_grad = false;
  at::Tensor shard;        // [local_rows, ...] view of the unit's flat shard
  at::Tensor full;         // full sizes, param dtype; storage freed at rest
  at::Tensor stash;        // the sharded gradient, set aside during backward
  at::Tensor accumulated;  // set_requires_gradient_sync(false): the full gradient so far

  int64_t padded_numel() const { return chunk_rows * row_numel; }
  /// The first full row that rank r holds.
  int64_t first_row(int r) const { return std::min(rows, r * chunk_rows); }
  int64_t rows_of(int r) const {
    return std::max<int64_t>(0, std::min(rows, (r + 1) * chunk_rows) - first_row(r));
  }
  std::vector<int64_t> shard_sizes(int64_t n_rows) const;
};

/// Schedule state of one unit, kept by fully_shard.cpp.
struct RootStep;
class ShardUnit;
struct UnitSchedule {
  torch::nn::Module* wrapper = nullptr;  // the FullyShardImpl
  ShardUnit* root = nullptr;             // set at the root's first forward
  bool is_root = false;
  bool requires_gradient_sync = true;
  bool ran_forward = false;         // in this step
  bool post_backward_done = false;  // in this step
  std::shared_ptr<RootStep> step;   // the root's only
};

class ShardUnit final : public ShardOwner {
 public:
  ShardUnit(std::string name, std::shared_ptr<ProcessGroup> pg, FullyShardOptions options);
  ~ShardUnit();

  /// Shards `params` (name, tensor), which must be on the group's device and equal on
  /// every rank (checked, collective).
  void shard(std::vector<std::pair<std::string, at::Tensor>> params);

  const std::string& name() const override { return name_; }
  /// Where the unit sits in its root's tree ("blocks.3"; "" for the root), set at the
  /// root's first forward; the observer's name for it (the module's name until then).
  const std::string& label() const { return path_set_ ? path_ : name_; }
  void set_path(std::string path) {
    path_ = std::move(path);
    path_set_ = true;
  }
  /// HSDP: the group across which the sharded gradients are all-reduced (the mesh's
  /// replicate dimension); null without one. Set before shard().
  void set_replicate(std::shared_ptr<ProcessGroup> replicate) { replicate_ = std::move(replicate); }
  const std::shared_ptr<ProcessGroup>& replicate() const { return replicate_; }
  void set_requires_all_reduce(bool on) { requires_all_reduce_ = on; }
  ProcessGroup& group() const { return *pg_; }
  const std::shared_ptr<ProcessGroup>& group_ptr() const { return pg_; }
  const FullyShardOptions& options() const { return options_; }
  FullyShardOptions& options() { return options_; }
  std::vector<ShardedParam>& params() { return params_; }
  const std::vector<ShardedParam>& params() const { return params_; }
  bool unsharded() const override { return unsharded_; }
  const torch::nn::Module* module() const override { return schedule.wrapper; }
  at::ScalarType param_dtype() const;
  at::ScalarType reduce_dtype() const;

  /// Launches the all-gather (a no-op when unsharded or already launched).
  void start_unshard();
  /// Waits for it and makes every parameter full.
  void finish_unshard();
  /// Waits for the launched all-gather (its output kept for good if it failed).
  void wait_gather();
  /// Parameters back to their shards; the full storage freed.
  void reshard();

  /// Sets each parameter's sharded gradient aside, so that backward accumulates the full
  /// one into an empty .grad().
  void stash_grads();
  /// Takes the full gradients off the parameters and launches one reduce-scatter (or,
  /// without gradient sync, keeps them for the next backward). Puts the stashed
  /// gradients back when nothing is reduced.
  void reduce_grads(bool sync);
  /// Waits for the reduce-scatter (and with HSDP the all-reduce) and adds each sharded
  /// gradient to its parameter.
  void finish_reduce();
  /// One step of finish_reduce: waits for the reduce-scatter and, with HSDP, launches
  /// the all-reduce across replicas and returns; or waits for that all-reduce and
  /// finishes.
  void advance_reduce();
  bool reduce_pending() const { return rs_.pending; }

  /// Every rank's rows of a tensor shaped like p's shard (the shard itself, its gradient,
  /// an optimizer's state for it) put together in p's full shape. Collective.
  at::Tensor gather_rows(const ShardedParam& p, const at::Tensor& rows) const;
  /// This rank's rows of `full` (p's full shape), shaped like p's shard: a view.
  at::Tensor rows_of_this_rank(const ShardedParam& p, const at::Tensor& full) const;

  UnitSchedule schedule;

 private:
  std::string name_;
  std::string path_;
  bool path_set_ = false;
  std::shared_ptr<ProcessGroup> pg_;
  std::shared_ptr<ProcessGroup> replicate_;  // HSDP's replicate dimension, or null
  bool requires_all_reduce_ = true;
  at::Tensor partial_;  // HSDP: reduce-scattered sums not yet all-reduced
  FullyShardOptions options_;
  int rank_ = 0;
  int world_ = 1;
  std::vector<ShardedParam> params_;
  at::Tensor flat_shard_;  // this rank's padded shards, one after another
  int64_t shard_numel_ = 0;
  bool unsharded_ = false;

  struct Gather {
    bool pending = false;
    Work work;
    at::Tensor input, output;
    HostBlock block;  // output's bytes (Note [Host blocks])
  } ag_;
  HostBlock full_block_;  // the full parameters' bytes while unsharded
  struct Reduce {
    bool pending = false;
    std::shared_ptr<PendingWork> work;
    at::Tensor input, output;
    HostBlock input_block;         // input's bytes (Note [Host blocks])
    std::vector<size_t> reduced;   // indices into params_, in the buffer's order
    std::vector<int64_t> offsets;  // each one's offset in a rank's row
    int64_t width = 0;             // gradient elements per rank's row (then the flags)
    double post_divide = 1;
    at::ScalarType dtype = at::kFloat;  // reduce_dtype(); the wire's may be wider
    bool all_reducing = false;          // HSDP: the all-reduce of output is in flight
    Work all_reduce;
  } rs_;
  void complete_reduce();  // the sums are final: hands them to the parameters' .grad
};

/// Tells the observer, if one is installed (set_fully_shard_observer).
void notify(FullyShardEvent event, const std::string& unit);

/// Turns on the caching CPU allocator once, unless DDP_CPU_CACHING_ALLOCATOR=0 (Note
/// [fully_shard turns on the caching CPU allocator], fully_shard.cpp).
void default_cpu_caching_allocator();

/// Which unit shards this tensor, or nullptr (an unsharded parameter).
ShardUnit* unit_of_param(const at::Tensor& param);

/// A tensor fully_shard holds: its unit and its record there; empty for any other.
struct ShardedRef {
  ShardUnit* unit = nullptr;
  const ShardedParam* param = nullptr;
  explicit operator bool() const { return param != nullptr; }
};
ShardedRef sharded_ref(const at::Tensor& param);

}  // namespace detail
}  // namespace ddp
