#pragma once

// DistributedSampler: each rank sees its own share of a dataset, in exactly the order
// that Python's torch.utils.data.distributed.DistributedSampler gives for the same
// arguments, and a run stopped mid-epoch resumes with exactly the samples it had not
// yet seen.
//
// Example:
//   ddp::DistributedSampler sampler(dataset.size().value(),
//                                   ddp::DistributedSamplerOptions().seed(42));
//   auto loader = torch::data::make_data_loader(
//       dataset.map(torch::data::transforms::Stack<>()), sampler,
//       torch::data::DataLoaderOptions().batch_size(32));
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);          // the loader's copy sees it: copies share state
//     for (auto& batch : *loader) { ... }
//   }

#include <torch/arg.h>
#include <torch/data/samplers/base.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace ddp {

/// How a dataset is split across ranks. Names and defaults follow PyTorch's
/// DistributedSampler(dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
/// drop_last=False).
///
/// Example:
///   ddp::DistributedSamplerOptions().shuffle(true).seed(42).drop_last(false);
///   ddp::DistributedSamplerOptions().num_replicas(4).rank(1);   // no process group
struct DistributedSamplerOptions {
  /// Number of ranks sharing the dataset; unset: the default process group's size.
  TORCH_ARG(std::optional<int64_t>, num_replicas) = std::nullopt;
  /// This rank, 0..num_replicas-1; unset: the default process group's rank.
  TORCH_ARG(std::optional<int64_t>, rank) = std::nullopt;
  /// Permute the indices every epoch (torch.randperm seeded with seed + epoch).
  TORCH_ARG(bool, shuffle) = true;
  /// Must be the same on every rank.
  TORCH_ARG(int64_t, seed) = 0;
  /// Drop the tail so that every rank gets n / num_replicas samples (rounded down);
  /// false: pad by repeating indices from the head (rounded up).
  TORCH_ARG(bool, drop_last) = false;
};

/// One earlier layout of the current epoch: the number of ranks that started it and how
/// many indices each had handed out when the run stopped. See Note [Re-sharding an epoch]
/// in src/data/reshard.h.
struct DistributedSamplerStage {
  int64_t num_replicas = 1;
  std::vector<int64_t> positions;  // one per rank of that layout
};

/// A sampler's position as plain values, for checkpoints (see ddp::save_checkpoint).
/// `position` counts the indices this rank has already handed out in `epoch`.
struct DistributedSamplerState {
  int64_t epoch = 0;
  int64_t position = 0;
  int64_t dataset_size = 0;
  int64_t num_replicas = 1;
  int64_t rank = 0;
  bool shuffle = true;
  int64_t seed = 0;
  bool drop_last = false;
  /// Earlier layouts of this epoch, oldest first; empty unless the epoch was resumed with
  /// another number of ranks. The current layout shares out only the samples they had not
  /// handed out yet.
  std::vector<DistributedSamplerStage> earlier_stages;
};

/// A LibTorch sampler (plugs into torch::data::make_data_loader) that hands this rank
/// the indices Python's DistributedSampler would, batch by batch.
///
/// Copies share state, like a ModuleHolder: make_data_loader takes its sampler by
/// value, and set_epoch on the caller's copy must reach the loader's copy.
/// Not thread-safe: call it from one thread (the data loader calls next() from the
/// thread that iterates it, also when it has workers).
class DistributedSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  using Options = DistributedSamplerOptions;

  /// Throws when the dataset is empty, rank >= num_replicas, drop_last leaves no
  /// samples, or num_replicas/rank are unset and no default process group exists.
  explicit DistributedSampler(size_t dataset_size, const DistributedSamplerOptions& options = {});

  /// Starts epoch `epoch` from its beginning (Python's set_epoch). Every rank must call
  /// it with the same value. After load()/load_state() for the same epoch it keeps the
  /// restored position instead; see Note [Resume position].
  void set_epoch(int64_t epoch);
  int64_t epoch() const;

  /// Rewinds to the start of the current epoch (the data loader calls this at begin()).
  /// A new size different from the current one changes the dataset size.
  void reset(torch::optional<size_t> new_size = torch::nullopt) override;
  /// The next up to batch_size indices of this rank, or nullopt when the epoch is done.
  torch::optional<std::vector<size_t>> next(size_t batch_size) override;

  /// Writes/reads the state (epoch, position and the options that fix the order).
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// The state as plain values (position = indices handed out so far this epoch).
  /// With a data loader that prefetches (workers > 0), set `position` yourself to the
  /// number of samples the training loop has consumed.
  DistributedSamplerState state() const;
  /// Restores a state; the next indices are those after `position` of its epoch.
  /// Mid-epoch (position > 0) the dataset size, num_replicas, rank, shuffle, seed and
  /// drop_last must equal this sampler's, else the remaining samples would differ.
  void load_state(const DistributedSamplerState& state);
  /// Continues epoch `epoch`, which `stages` (oldest first) had started with other numbers
  /// of ranks, on this sampler's ranks: the samples those ranks had not yet handed out are
  /// shared among this sampler's, so that every sample of the epoch is still seen once
  /// (apart from the padding that makes shares equal, as in Python; with drop_last, the
  /// remainder is dropped instead). Every rank must pass the same stages. Used by
  /// load_checkpoint when a run resumes mid-epoch with another world size (elastic
  /// restarts). The next epoch is Python's order again.
  void reshard(int64_t epoch, const std::vector<DistributedSamplerStage>& stages);
  /// Throws exactly when load_state(state) would, and changes nothing.
  void check_state(const DistributedSamplerState& state) const;

  /// All of this rank's indices for the current epoch, in order: Python's
  /// list(iter(sampler)).
  const std::vector<size_t>& indices() const;
  /// Indices per rank per epoch: Python's len(sampler).
  size_t num_samples() const;
  /// num_samples() * num_replicas().
  size_t total_size() const;
  /// Indices this rank has handed out so far this epoch.
  size_t position() const;
  size_t dataset_size() const;
  int64_t num_replicas() const;
  int64_t rank() const;
  const DistributedSamplerOptions& options() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace ddp
