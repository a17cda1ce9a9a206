#include <ddp/data/distributed_sampler.h>

#include <ddp/distributed/process_group.h>

#include "data/permutation.h"
#include "data/reshard.h"
#include "distributed/common/check.h"

#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <string>

namespace ddp {

// Note [Python's order]
// Python's DistributedSampler (torch/utils/data/distributed.py) computes, per epoch:
//   indices = randperm(n, generator seeded with seed + epoch) if shuffle else 0..n-1
//   pad to total_size by repeating from the head (cyclically), or truncate if drop_last
//   this rank's indices = indices[rank : total_size : num_replicas]
// Padding cyclically means padded[i] == indices[i % n], so rank r's k-th index is
// indices[(r + k * num_replicas) % n]; with drop_last every position is < n anyway.
// The permutation comes from the same ATen kernel Python calls (data/permutation.h).

// Note [Resume position]
// A data loader calls reset() at begin(), and a training loop calls set_epoch(e) before
// every epoch; both normally rewind to the start of the epoch. After load()/load_state()
// the sampler is "resuming": the first reset(), and set_epoch() with the restored
// epoch, keep the restored position, so the usual loop
//   load checkpoint; for (e = saved_epoch; ...) { set_epoch(e); for (batch : loader) }
// continues with exactly the samples not yet seen. Handing out indices, or set_epoch()
// with another epoch, ends the resuming state.

struct DistributedSampler::State {
  DistributedSamplerOptions options;
  size_t dataset_size = 0;
  int64_t num_replicas = 1;
  int64_t rank = 0;
  int64_t epoch = 0;
  size_t num_samples = 0;
  size_t position = 0;
  bool resuming = false;
  std::vector<DistributedSamplerStage> stages;  // Note [Re-sharding an epoch]
  std::vector<size_t> indices;

  void validate() const {
    DDP_CHECK(dataset_size > 0,
              "DistributedSampler: the dataset is empty (dataset_size=0); expected at "
              "least one sample. Check that the dataset was loaded.");
    DDP_CHECK(num_replicas >= 1, "DistributedSampler: num_replicas must be >= 1, but got ",
              num_replicas);
    DDP_CHECK(rank >= 0 && rank < num_replicas, "DistributedSampler: rank must be in 0..",
              num_replicas - 1, " (num_replicas=", num_replicas, "), but got ", rank,
              ". Pass this process's rank (ddp::get_rank()).");
    DDP_CHECK(!options.drop_last() || dataset_size >= static_cast<size_t>(num_replicas),
              "DistributedSampler: drop_last=true with dataset_size=", dataset_size,
              " < num_replicas=", num_replicas,
              " leaves no samples for any rank; expected dataset_size >= num_replicas. "
              "Use drop_last=false (pads by repeating samples) or fewer ranks.");
  }

  // The epoch's order of the whole dataset: Python's permutation, or 0..n-1.
  std::vector<size_t> order() const {
    std::vector<size_t> out(dataset_size);
    if (options.shuffle()) {
      const std::vector<int64_t> perm =
          detail::python_randperm(static_cast<int64_t>(dataset_size),
                                  static_cast<uint64_t>(options.seed()) +
                                      static_cast<uint64_t>(epoch));
      for (size_t i = 0; i < dataset_size; ++i) out[i] = static_cast<size_t>(perm[i]);
    } else {
      for (size_t i = 0; i < dataset_size; ++i) out[i] = i;
    }
    return out;
  }

  // Note [Python's order]; after a resume with another number of ranks, Note
  // [Re-sharding an epoch].
  void rebuild() {
    std::vector<size_t> list = order();
    if (!stages.empty())
      list = detail::remaining_after(std::move(list), stages, options.drop_last());
    num_samples = detail::share_size(list.size(), num_replicas, options.drop_last());
    indices.assign(num_samples, 0);
    const size_t replicas = static_cast<size_t>(num_replicas);
    for (size_t k = 0; k < num_samples; ++k) {
      indices[k] = list[(static_cast<size_t>(rank) + k * replicas) % list.size()];
    }
  }
};

DistributedSampler::DistributedSampler(size_t dataset_size,
                                       const DistributedSamplerOptions& options)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.options = options;
  s.dataset_size = dataset_size;
  if (!options.num_replicas() || !options.rank()) {
    DDP_CHECK(is_initialized(),
              "DistributedSampler: ", !options.num_replicas() ? "num_replicas" : "rank",
              " is unset and no default process group is initialised. Call "
              "ddp::init_process_group() before creating the sampler, or set both "
              "explicitly: DistributedSamplerOptions().num_replicas(N).rank(r).");
  }
  s.num_replicas = options.num_replicas() ? *options.num_replicas() : get_world_size();
  s.rank = options.rank() ? *options.rank() : get_rank();
  s.options.num_replicas(s.num_replicas).rank(s.rank);
  s.validate();
  s.rebuild();
}

void DistributedSampler::set_epoch(int64_t epoch) {
  State& s = *state_;
  if (s.resuming && epoch == s.epoch) return;  // Note [Resume position]
  s.resuming = false;
  s.position = 0;
  if (epoch != s.epoch) {
    s.epoch = epoch;
    s.stages.clear();  // a re-sharded epoch is over; the next is Python's again
    s.rebuild();
  }
}

int64_t DistributedSampler::epoch() const { return state_->epoch; }

void DistributedSampler::reset(torch::optional<size_t> new_size) {
  State& s = *state_;
  if (new_size && *new_size != s.dataset_size) {
    const size_t old_size = s.dataset_size;
    s.dataset_size = *new_size;
    try {
      s.validate();
    } catch (...) {
      s.dataset_size = old_size;
      throw;
    }
    s.resuming = false;
    s.stages.clear();
    s.rebuild();
  }
  if (!s.resuming) s.position = 0;  // Note [Resume position]
}

torch::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  State& s = *state_;
  s.resuming = false;
  DDP_CHECK(batch_size > 0, "DistributedSampler::next: batch_size must be > 0, but got 0");
  if (s.position >= s.indices.size()) return torch::nullopt;
  const size_t end = std::min(s.indices.size(), s.position + batch_size);
  std::vector<size_t> batch(s.indices.begin() + static_cast<std::ptrdiff_t>(s.position),
                            s.indices.begin() + static_cast<std::ptrdiff_t>(end));
  s.position = end;
  return batch;
}

DistributedSamplerState DistributedSampler::state() const {
  const State& s = *state_;
  DistributedSamplerState out;
  out.epoch = s.epoch;
  out.position = static_cast<int64_t>(s.position);
  out.dataset_size = static_cast<int64_t>(s.dataset_size);
  out.num_replicas = s.num_replicas;
  out.rank = s.rank;
  out.shuffle = s.options.shuffle();
  out.seed = s.options.seed();
  out.drop_last = s.options.drop_last();
  out.earlier_stages = s.stages;
  return out;
}

namespace {

template <typename T>
void check_same(const char* field, const T& saved, const T& mine,
                const DistributedSamplerState& state) {
  DDP_CHECK(saved == mine, "DistributedSampler::load_state: the saved state has ", field, "=",
            saved, " but this sampler has ", field, "=", mine,
            ". It was saved mid-epoch (position ", state.position, " of epoch ", state.epoch,
            "), so the remaining samples depend on ", field, ". Create the sampler with ", field,
            "=", saved, ", or resume from a checkpoint saved at an epoch boundary.");
}

}  // namespace

void DistributedSampler::check_state(const DistributedSamplerState& state) const {
  const State& s = *state_;
  DDP_CHECK(state.position >= 0,
            "DistributedSampler::load_state: position must be >= 0, "
            "but got ",
            state.position);
  if (state.position > 0 || !state.earlier_stages.empty()) {
    check_same("dataset_size", state.dataset_size, static_cast<int64_t>(s.dataset_size), state);
    check_same("num_replicas", state.num_replicas, s.num_replicas, state);
    check_same("rank", state.rank, s.rank, state);
    check_same("shuffle", state.shuffle, s.options.shuffle(), state);
    check_same("seed", state.seed, s.options.seed(), state);
    check_same("drop_last", state.drop_last, s.options.drop_last(), state);
    const size_t num_samples = detail::samples_per_rank(s.dataset_size, state.earlier_stages,
                                                        s.num_replicas, s.options.drop_last());
    DDP_CHECK(static_cast<size_t>(state.position) <= num_samples,
              "DistributedSampler::load_state: position ", state.position,
              " is past the end of the epoch (", num_samples,
              " samples per rank); the state is corrupt.");
  }
}

void DistributedSampler::load_state(const DistributedSamplerState& state) {
  check_state(state);
  State& s = *state_;
  if (state.epoch != s.epoch || !state.earlier_stages.empty() || !s.stages.empty()) {
    s.epoch = state.epoch;
    s.stages = state.earlier_stages;
    s.rebuild();
  }
  s.position = static_cast<size_t>(state.position);
  s.resuming = true;
}

void DistributedSampler::reshard(int64_t epoch,
                                 const std::vector<DistributedSamplerStage>& stages) {
  DistributedSamplerState st = state();
  st.epoch = epoch;
  st.position = 0;
  st.earlier_stages = stages;
  load_state(st);
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  const DistributedSamplerState st = state();
  archive.write("epoch", c10::IValue(st.epoch));
  archive.write("position", c10::IValue(st.position));
  archive.write("dataset_size", c10::IValue(st.dataset_size));
  archive.write("num_replicas", c10::IValue(st.num_replicas));
  archive.write("rank", c10::IValue(st.rank));
  archive.write("shuffle", c10::IValue(st.shuffle));
  archive.write("seed", c10::IValue(st.seed));
  archive.write("drop_last", c10::IValue(st.drop_last));
  if (!st.earlier_stages.empty()) {  // flat: num_replicas, then its positions, per stage
    std::vector<int64_t> flat;
    for (const auto& stage : st.earlier_stages) {
      flat.push_back(stage.num_replicas);
      flat.insert(flat.end(), stage.positions.begin(), stage.positions.end());
    }
    archive.write("earlier_stages", c10::IValue(flat));
  }
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  auto read = [&](const char* key) {
    c10::IValue v;
    DDP_CHECK(archive.try_read(key, v), "DistributedSampler::load: the archive has no '", key,
              "'; expected one written by ddp::DistributedSampler::save.");
    return v;
  };
  DistributedSamplerState st;
  st.epoch = read("epoch").toInt();
  st.position = read("position").toInt();
  st.dataset_size = read("dataset_size").toInt();
  st.num_replicas = read("num_replicas").toInt();
  st.rank = read("rank").toInt();
  st.shuffle = read("shuffle").toBool();
  st.seed = read("seed").toInt();
  st.drop_last = read("drop_last").toBool();
  c10::IValue stages;
  if (archive.try_read("earlier_stages", stages)) {
    const std::vector<int64_t> flat = stages.toIntVector();
    for (size_t i = 0; i < flat.size();) {
      DistributedSamplerStage stage;
      stage.num_replicas = flat[i++];
      DDP_CHECK(stage.num_replicas >= 1 &&
                    i + static_cast<size_t>(stage.num_replicas) <= flat.size(),
                "DistributedSampler::load: 'earlier_stages' is corrupt.");
      stage.positions.assign(flat.begin() + static_cast<std::ptrdiff_t>(i),
                             flat.begin() + static_cast<std::ptrdiff_t>(i) + stage.num_replicas);
      i += static_cast<size_t>(stage.num_replicas);
      st.earlier_stages.push_back(std::move(stage));
    }
  }
  load_state(st);
}

const std::vector<size_t>& DistributedSampler::indices() const { return state_->indices; }
size_t DistributedSampler::num_samples() const { return state_->num_samples; }
size_t DistributedSampler::total_size() const {
  return state_->num_samples * static_cast<size_t>(state_->num_replicas);
}
size_t DistributedSampler::position() const { return state_->position; }
size_t DistributedSampler::dataset_size() const { return state_->dataset_size; }
int64_t DistributedSampler::num_replicas() const { return state_->num_replicas; }
int64_t DistributedSampler::rank() const { return state_->rank; }
const DistributedSamplerOptions& DistributedSampler::options() const { return state_->options; }

}  // namespace ddp
