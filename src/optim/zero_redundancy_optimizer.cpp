// ZeroRedundancyOptimizer: construction, step and the parameter sync. The state
// exchange (consolidate, load) is in zero_state.cpp, checkpoints in zero_checkpoint.cpp.

#include <ddp/optim/zero_redundancy_optimizer.h>

#include "distributed/common/check.h"
#include "distributed/comm.h"
#include "optim/partition.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/lbfgs.h>

#include <map>
#include <tuple>
#include <utility>

namespace ddp {

// Note [ZeRO parameter sync]
// After each rank stepped its shard, rank r's parameters must reach every rank. The
// parameters are grouped by (device, dtype), since one collective moves one dtype.
// kAllGather packs this rank's parameters of a bucket into one flat chunk, padded to the
// largest rank's chunk (at most one parameter's numel more than the smallest, Note [ZeRO
// partition]), all-gathers the chunks into one flat tensor and copies every other
// rank's parameters out of it: one collective per bucket. kBroadcast sends each rank's
// chunk, unpadded, by a broadcast from that rank: world_size collectives per bucket,
// all launched before the first is waited for.
struct ZeroRedundancyOptimizer::SyncPlan {
  struct Bucket {
    at::TensorOptions options;
    std::vector<std::vector<at::Tensor>> params;  // per rank, in param-group order
    std::vector<int64_t> numel;                   // per rank
    int64_t chunk = 0;                            // the largest rank's numel
  };
  std::vector<Bucket> buckets;
};

namespace {

std::shared_ptr<ProcessGroup> resolve_group(const ZeroRedundancyOptimizerOptions& options) {
  if (options.process_group()) return options.process_group();
  DDP_CHECK(is_initialized(),
            "ZeroRedundancyOptimizer: no process group: "
            "ZeroRedundancyOptimizerOptions::process_group is not set and the default group "
            "is not initialised. Call ddp::init_process_group() first, or pass a group with "
            "ZeroRedundancyOptimizerOptions().process_group(pg).");
  return default_group();
}

// Copies `from` (flat) into the parameters, in order.
void unpack(const at::Tensor& from, const std::vector<at::Tensor>& params) {
  int64_t offset = 0;
  for (const at::Tensor& p : params) {
    p.copy_(from.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
}

// The parameters, flattened one after the other into the front of `into`.
void pack(const std::vector<at::Tensor>& params, const at::Tensor& into) {
  int64_t offset = 0;
  for (const at::Tensor& p : params) {
    into.narrow(0, offset, p.numel()).view(p.sizes()).copy_(p);
    offset += p.numel();
  }
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(
    const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
    std::unique_ptr<torch::optim::OptimizerOptions> defaults, detail::ShardOptimizerFactory factory,
    ZeroRedundancyOptimizerOptions options)
    : torch::optim::Optimizer(param_groups, std::move(defaults)),
      group_(resolve_group(options)),
      options_(std::move(options)),
      sync_(std::make_unique<SyncPlan>()) {
  const int world = group_->size();
  const int rank = group_->rank();
  detail::check_same_everywhere(*group_, detail::describe_parameters(this->param_groups()),
                                "ZeroRedundancyOptimizer");

  std::vector<std::vector<int64_t>> numels;
  for (const auto& group : this->param_groups()) {
    numels.emplace_back();
    for (const auto& p : group.params()) numels.back().push_back(p.numel());
  }
  owners_ = detail::partition_parameters(numels, world);

  // This rank's part of every param group (empty ones too, so that group g of the
  // shard's optimizer is group g here), in the groups' order, with their options.
  std::vector<torch::optim::OptimizerParamGroup> shard;
  size_t index = 0;
  std::map<std::tuple<c10::DeviceType, c10::DeviceIndex, c10::ScalarType>, size_t> bucket_of;
  for (const auto& group : this->param_groups()) {
    std::vector<at::Tensor> mine;
    for (const auto& p : group.params()) {
      const int owner = owners_[index++];
      if (owner == rank) mine.push_back(p);
      const auto key = std::make_tuple(p.device().type(), p.device().index(), p.scalar_type());
      auto it = bucket_of.find(key);
      if (it == bucket_of.end()) {
        it = bucket_of.emplace(key, sync_->buckets.size()).first;
        SyncPlan::Bucket bucket;
        bucket.options = p.options();
        bucket.params.resize(static_cast<size_t>(world));
        bucket.numel.assign(static_cast<size_t>(world), 0);
        sync_->buckets.push_back(std::move(bucket));
      }
      SyncPlan::Bucket& bucket = sync_->buckets[it->second];
      bucket.params[static_cast<size_t>(owner)].push_back(p);
      bucket.numel[static_cast<size_t>(owner)] += p.numel();
    }
    shard.emplace_back(std::move(mine), group.options().clone());
  }
  for (auto& bucket : sync_->buckets) {
    bucket.chunk = *std::max_element(bucket.numel.begin(), bucket.numel.end());
  }
  local_ = factory(shard);
  DDP_CHECK(dynamic_cast<const torch::optim::LBFGS*>(local_.get()) == nullptr,
            "ZeroRedundancyOptimizer cannot shard torch::optim::LBFGS: its state (the "
            "curvature history) spans all parameters, so no rank can step a part of them "
            "alone. Use LBFGS unsharded.");
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

void ZeroRedundancyOptimizer::pass_options_to_shard() {
  // LibTorch's add_param_group is not virtual, so a group added later reaches
  // param_groups() without being partitioned.
  DDP_CHECK(param_groups().size() == local_->param_groups().size(),
            "ZeroRedundancyOptimizer on rank ", group_->rank(), " was built with ",
            local_->param_groups().size(), " param group(s) but now has ", param_groups().size(),
            ": add_param_group after construction is not supported. "
            "Pass every param group to the constructor.");
  // param_groups() is what users and LR schedulers change (Note in the header).
  for (size_t g = 0; g < param_groups().size(); ++g) {
    local_->param_groups()[g].set_options(param_groups()[g].options().clone());
  }
}

at::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  pass_options_to_shard();
  consolidated_.reset();  // describes the state before this step
  at::Tensor loss = local_->step(std::move(closure));
  sync_parameters();
  return loss;
}

void ZeroRedundancyOptimizer::sync_parameters() {
  const int world = group_->size();
  if (detail::comm_of(*group_).trivial()) return;
  const int rank = group_->rank();
  at::NoGradGuard no_grad;
  for (const auto& bucket : sync_->buckets) {
    if (bucket.chunk == 0) continue;  // every rank sees the same numels
    if (options_.parameter_sync() == ParameterSync::kAllGather) {
      at::Tensor mine = at::empty({bucket.chunk}, bucket.options);
      pack(bucket.params[static_cast<size_t>(rank)], mine);
      at::Tensor flat = at::empty({bucket.chunk * world}, bucket.options);
      group_->all_gather_into_tensor(flat, mine);
      for (int r = 0; r < world; ++r) {
        if (r == rank) continue;
        unpack(flat.narrow(0, r * bucket.chunk, bucket.chunk),
               bucket.params[static_cast<size_t>(r)]);
      }
      continue;
    }
    std::vector<at::Tensor> chunks(static_cast<size_t>(world));
    std::vector<Work> works;
    for (int r = 0; r < world; ++r) {
      const int64_t numel = bucket.numel[static_cast<size_t>(r)];
      if (numel == 0) continue;
      chunks[static_cast<size_t>(r)] = at::empty({numel}, bucket.options);
      if (r == rank) pack(bucket.params[static_cast<size_t>(r)], chunks[static_cast<size_t>(r)]);
      std::vector<at::Tensor> tensors{chunks[static_cast<size_t>(r)]};
      works.push_back(group_->broadcast_async(tensors, r));
    }
    for (Work& work : works) work.wait();
    for (int r = 0; r < world; ++r) {
      if (r == rank || !chunks[static_cast<size_t>(r)].defined()) continue;
      unpack(chunks[static_cast<size_t>(r)], bucket.params[static_cast<size_t>(r)]);
    }
  }
}

void ZeroRedundancyOptimizer::save(torch::serialize::OutputArchive&) const {
  DDP_CHECK(false, "ZeroRedundancyOptimizer cannot be written with torch::save: rank ",
            group_->rank(),
            " holds only its shard of the state. Use ddp::save_checkpoint "
            "with Checkpoint::optimizer(&optimizer), which writes the whole state as an "
            "unsharded optimizer's, or consolidate_state_dict() and state_dict().");
}

void ZeroRedundancyOptimizer::load(torch::serialize::InputArchive&) {
  DDP_CHECK(false, "ZeroRedundancyOptimizer cannot be read with torch::load. Use "
                   "ddp::load_checkpoint with Checkpoint::optimizer(&optimizer), or "
                   "load_state_dict() with an unsharded optimizer's state.");
}

}  // namespace ddp
