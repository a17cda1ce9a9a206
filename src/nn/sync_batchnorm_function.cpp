// The autograd Function of a synchronised batch norm.
//
// Forward: y = (x - mean) * invstd * w + b with the group's mean and invstd (computed by
// the caller, see sync_batchnorm_stats.cpp). Backward, with xhat = (x - mean) * invstd
// and n the group's count per channel, the gradient of one BatchNorm over the whole
// batch is
//   dL/dx = w * invstd * (dy - sum(dy) / n - (x - mean) * invstd^2 * sum(dy * (x - mean)) / n)
// where the two sums run over every rank's values: they are the only cross-rank terms,
// so backward all-reduces them (2C values) and nothing else. dL/dw = sum(dy * xhat) and
// dL/db = sum(dy) are left as this rank's share, as in PyTorch: DistributedDataParallel
// (or the caller) reduces them with the other parameters' gradients.
//
// Note [Collective order]
// Collectives on a group pair up by the order in which each rank issues them (c10d
// gives each one the next sequence tag on that rank; NCCL queues them on one stream), so
// every rank must issue the same collectives in the same order. This backward issues its
// all-reduce from the autograd engine's thread, in the middle of backward, while
// DistributedDataParallel's gradient hooks launch bucket all-reduces on the same group
// from the same thread. On every rank the engine runs the same graph in the same order
// (one thread per device, nodes ordered by their sequence numbers), and DDP launches
// buckets strictly in bucket order as their gradients become ready, so the interleaving
// of bucket launches and these all-reduces is the same everywhere. The all-reduce here
// is blocking; the buckets launched before it are asynchronous and complete on the
// backend's own threads, so waiting for it cannot deadlock. Only a rank whose graph
// differs (a SyncBatchNorm used on some ranks only, or input gradients needed on some
// ranks only) breaks the pairing: that is a usage error, as in PyTorch, and ends in a
// mismatch or a timeout. Whether to all-reduce depends only on needs_input_grad(0), the
// same on every rank of such a program; a rank with an empty batch still takes part.

#include "nn/sync_batchnorm_ops.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>

namespace ddp {
namespace detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Carries the group from forward to backward through ctx->saved_data.
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(std::shared_ptr<ProcessGroup> g) : group(std::move(g)) {}
  std::shared_ptr<ProcessGroup> group;
};

/// [C] -> [1, C, 1, ...] to broadcast against an input of `dim` dimensions.
at::Tensor per_channel(const at::Tensor& t, int64_t dim) {
  std::vector<int64_t> shape(static_cast<size_t>(dim), 1);
  shape[1] = t.numel();
  return t.view(shape);
}

struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& mean,
                            const at::Tensor& invstd, int64_t count,
                            std::shared_ptr<ProcessGroup> group) {
    const int64_t dim = input.dim();
    // y = x * scale + shift, as ATen's CPU batch norm computes it.
    const at::Tensor scale = invstd * weight;
    const at::Tensor shift = bias - mean * scale;
    at::Tensor output = at::addcmul(per_channel(shift, dim), input, per_channel(scale, dim))
                            .to(input.scalar_type());

    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["group"] =
        c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(std::move(group)));
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const int64_t count = ctx->saved_data["count"].toInt();
    const auto group =
        c10::static_intrusive_pointer_cast<GroupCapsule>(ctx->saved_data["group"].toCapsule())
            ->group;

    const int64_t dim = input.dim();
    const int64_t channels = input.size(1);
    const std::vector<int64_t> dims = reduced_dims(input);
    const at::Tensor dy = grad_outputs[0].contiguous();
    const at::Tensor xmu = input - per_channel(mean, dim);
    // This rank's sums (zeros for an empty batch), in the statistics' dtype: float32 for
    // half and bfloat16 inputs, as PyTorch's batch_norm_backward_reduce. Summed in half
    // precision, gradients scaled by a GradScaler (2^16) overflow into false infs.
    at::Tensor sum_dy = at::sum(dy, dims, /*keepdim=*/false, mean.scalar_type());
    at::Tensor sum_dy_xmu = (dy * xmu).sum(dims);

    at::Tensor grad_input, grad_weight, grad_bias;
    // The stand-ins for affine = false never need a gradient.
    // (The engine casts each gradient to its input's dtype.)
    if (ctx->needs_input_grad(1)) grad_weight = sum_dy_xmu * invstd;
    if (ctx->needs_input_grad(2)) grad_bias = sum_dy;
    if (ctx->needs_input_grad(0)) {
      // See Note [Collective order].
      at::Tensor sums = at::cat({sum_dy, sum_dy_xmu});
      group->all_reduce(sums, ReduceOp::SUM);
      const double inv_count = 1.0 / static_cast<double>(std::max<int64_t>(count, 1));
      const at::Tensor mean_dy = sums.narrow(0, 0, channels) * inv_count;
      const at::Tensor mean_dy_xmu = sums.narrow(0, channels, channels) * inv_count;
      const at::Tensor scale = invstd * weight;
      grad_input =
          (dy - per_channel(mean_dy, dim) - xmu * per_channel(invstd * invstd * mean_dy_xmu, dim)) *
          per_channel(scale, dim);
    }
    // One entry per forward argument: input, weight, bias, mean, invstd, count, group.
    return {grad_input,   grad_weight,  grad_bias,   at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor sync_batch_norm(const at::Tensor& input, const at::Tensor& weight,
                           const at::Tensor& bias, const at::Tensor& mean, const at::Tensor& invstd,
                           int64_t count, std::shared_ptr<ProcessGroup> group) {
  // Without affine parameters, a constant scale of 1 and shift of 0 stand in for them:
  // LibTorch 2.x's custom Functions refuse undefined tensor arguments.
  const bool affine = weight.defined();
  return SyncBatchNormFunction::apply(input, affine ? weight : at::ones_like(mean),
                                      affine ? bias : at::zeros_like(mean), mean, invstd, count,
                                      std::move(group));
}

}  // namespace detail
}  // namespace ddp
