// ddp::SyncBatchNorm, the module: options, state, and the choice between a plain
// BatchNorm forward and a synchronised one. The collectives and the maths live in
// sync_batchnorm_stats.cpp (forward statistics) and sync_batchnorm_function.cpp (the
// autograd Function and its backward).

#include <ddp/nn/sync_batchnorm.h>

#include <ddp/errors.h>

#include "distributed/common/check.h"
#include "distributed/comm.h"
#include "nn/sync_batchnorm_ops.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/batchnorm.h>

#include <sstream>
#include <string>
#include <utility>

namespace ddp {

SyncBatchNormOptions::SyncBatchNormOptions(int64_t num_features) : num_features_(num_features) {}

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_)
    : SyncBatchNormImpl(std::move(options_), SharedState()) {}

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_, SharedState state)
    : options(std::move(options_)) {
  DDP_CHECK(options.num_features() > 0, "SyncBatchNorm: num_features must be > 0, but got ",
            options.num_features());
  DDP_CHECK(options.eps() >= 0, "SyncBatchNorm: eps must be >= 0, but got ", options.eps());
  DDP_CHECK(!options.momentum().has_value() ||
                (*options.momentum() >= 0 && *options.momentum() <= 1),
            "SyncBatchNorm: momentum must be in [0, 1] or nullopt (cumulative average), "
            "but got ",
            options.momentum().value_or(0));
  const bool adopt = state.weight.defined() || state.running_mean.defined();
  if (adopt) adopted_ = std::make_shared<SharedState>(std::move(state));
  reset();
}

void SyncBatchNormImpl::reset() {
  // BatchNorm's names, and undefined tensors where BatchNorm has them, so that state
  // dicts match torch::nn::BatchNorm and Python's (undefined ones are not listed).
  const int64_t c = options.num_features();
  const bool fresh = adopted_ == nullptr;
  SharedState s = fresh ? SharedState() : *adopted_;
  adopted_.reset();
  if (fresh && options.affine()) {
    s.weight = at::empty({c});
    s.bias = at::empty({c});
  }
  if (fresh && options.track_running_stats()) {
    s.running_mean = at::zeros({c});
    s.running_var = at::ones({c});
    s.num_batches_tracked = at::zeros({}, at::kLong);
  }
  // An adopted parameter keeps its requires_grad (a frozen layer stays frozen).
  weight = register_parameter("weight", s.weight,
                              s.weight.defined() && (fresh || s.weight.requires_grad()));
  bias = register_parameter("bias", s.bias, s.bias.defined() && (fresh || s.bias.requires_grad()));
  running_mean = register_buffer("running_mean", s.running_mean);
  running_var = register_buffer("running_var", s.running_var);
  num_batches_tracked = register_buffer("num_batches_tracked", s.num_batches_tracked);
  checked_group_.reset();
  if (fresh) reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  at::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  at::NoGradGuard no_grad;
  weight.fill_(1);
  bias.zero_();
}

std::shared_ptr<ProcessGroup> SyncBatchNormImpl::group_for_forward() const {
  if (!is_training()) return nullptr;  // eval: running statistics, no communication
  std::shared_ptr<ProcessGroup> group = options.process_group();
  if (!group) {
    if (!is_initialized()) return nullptr;  // a single process
    group = default_group();
  }
  // One rank without a backend (world size 1): plain BatchNorm, as in PyTorch. A real
  // one-rank group (InitOptions::single_rank_group) still goes through its backend.
  return detail::comm_of(*group).trivial() ? nullptr : group;
}

// Note [Channel handshake]
// Peers' statistics rows are 2C + 1 values long; a rank built with another num_features
// would send a row of another length, and the backend would fail inside the all-gather
// (or wait for bytes that never come) with a message about buffer sizes. So the first
// synchronised forward over a group first gathers every rank's num_features (one
// 8-byte all-gather) and every rank throws the same MismatchError naming the ranks that
// differ. Later forwards over the same group skip it: num_features cannot change, and
// an input with another channel count is refused locally. The group is remembered by a
// weak_ptr, so a new group (or the default group re-initialised) is checked again;
// reset() and clone() forget it. Every rank runs the handshake at the same point of the
// same forward, so it keeps the collectives in step (Note [Collective order]).
void SyncBatchNormImpl::check_channels_once(const std::shared_ptr<ProcessGroup>& group) {
  const bool same_group = !checked_group_.expired() && !checked_group_.owner_before(group) &&
                          !group.owner_before(checked_group_);
  if (same_group) return;
  const at::Tensor all =
      detail::all_gather_host(*group, at::full({1}, options.num_features(),
                                               at::TensorOptions().dtype(at::kLong)));
  const int64_t* channels = all.data_ptr<int64_t>();
  bool agree = true;
  std::ostringstream seen;
  for (int r = 0; r < group->size(); ++r) {
    agree = agree && channels[r] == options.num_features();
    seen << (r == 0 ? "" : ", ") << "rank " << r << " has " << channels[r];
  }
  if (!agree) {
    throw MismatchError(
        "SyncBatchNorm on rank " + std::to_string(group->rank()) + " of " +
        std::to_string(group->size()) +
        ": the ranks' layers have different numbers of "
        "channels (num_features): " +
        seen.str() +
        ". Every rank must build the same "
        "model; the batch statistics of different channel counts cannot be combined.");
  }
  checked_group_ = group;
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  const std::shared_ptr<ProcessGroup> group = group_for_forward();
  const std::string where = group ? " (rank " + std::to_string(group->rank()) + " of " +
                                        std::to_string(group->size()) + ")"
                                  : std::string();
  DDP_CHECK(input.dim() >= 2, "SyncBatchNorm", where,
            " expected an input of shape "
            "(N, C, ...) with at least 2 dimensions, but got ",
            input.dim(), "-D input of shape ", input.sizes());
  DDP_CHECK(input.size(1) == options.num_features(), "SyncBatchNorm", where, " expected ",
            options.num_features(),
            " channels (num_features) in dimension 1 of its "
            "input, but got ",
            input.size(1), " (input shape ", input.sizes(), ")");

  // Running-statistics bookkeeping exactly as torch::nn::BatchNorm does it.
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats() && num_batches_tracked.defined()) {
    num_batches_tracked.add_(1);
    if (!options.momentum().has_value()) {
      factor = 1.0 / num_batches_tracked.item<double>();  // cumulative moving average
    }
  }

  if (!group) {
    return torch::nn::functional::detail::batch_norm(input, running_mean, running_var, weight, bias,
                                                     /*training=*/is_training() ||
                                                         !options.track_running_stats(),
                                                     factor, options.eps());
  }

  check_channels_once(group);
  // Half and bfloat16 inputs are normalised with float statistics.
  const bool reduced = input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
  const at::ScalarType dtype = reduced ? at::kFloat : input.scalar_type();
  at::Tensor mean, invstd;
  int64_t count = 0;
  {
    at::NoGradGuard no_grad;
    detail::GlobalBatchStats stats = detail::gather_batch_stats(input, *group);
    count = stats.count;
    // Every rank sees the same count, so every rank throws here alike.
    DDP_CHECK(count != 1, "SyncBatchNorm", where,
              " expected more than 1 value per "
              "channel when training, but the batches of all ",
              group->size(), " ranks hold 1 value per channel together (this rank's input shape ",
              input.sizes(), ")");
    if (options.track_running_stats() && count > 0) {
      // As BatchNorm: the running variance takes the unbiased variance of the batch.
      const double n = static_cast<double>(count);
      running_mean.copy_(running_mean.to(at::kDouble) * (1 - factor) + stats.mean * factor);
      running_var.copy_(running_var.to(at::kDouble) * (1 - factor) +
                        stats.var * (n / (n - 1)) * factor);
    }
    mean = stats.mean.to(dtype);
    invstd = (stats.var + options.eps()).rsqrt().to(dtype);
  }
  return detail::sync_batch_norm(input, weight, bias, mean, invstd, count, group);
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "ddp::SyncBatchNorm(" << options.num_features()
         << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ')';
}

}  // namespace ddp
