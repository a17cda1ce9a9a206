// Forward statistics of a synchronised batch norm: this rank's, then the group's.
//
// Note [Count-weighted combine]
// Rank r has n_r values per channel (N_r * prod(spatial), possibly 0) with mean m_r and
// biased variance v_r. The group's are
//   n = sum_r n_r
//   m = sum_r n_r m_r / n
//   v = sum_r n_r (v_r + (m_r - m)^2) / n
// the parallel form of the variance (Chan et al.): every term is non-negative, so unlike
// E[x^2] - E[x]^2 nothing cancels when the mean is large against the spread. Averaging
// the ranks' means would be wrong as soon as batch sizes differ; a rank with n_r = 0
// contributes nothing (its m_r and v_r are sent as 0). The rows travel as float64, so
// counts stay exact beyond 2^24 and the combine adds no rounding of its own; each rank's
// m_r and v_r come from at::var_mean, which accumulates in double on the CPU.
// PyTorch gathers (mean, invstd, count) instead and combines them in
// batch_norm_gather_stats_with_counts; the result is the same up to rounding.

#include "nn/sync_batchnorm_ops.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace ddp {
namespace detail {

std::vector<int64_t> reduced_dims(const at::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

GlobalBatchStats gather_batch_stats(const at::Tensor& input, ProcessGroup& group) {
  const int64_t channels = input.size(1);
  const int64_t local_count = input.numel() / channels;

  // This rank's row: [mean (C), biased var (C), count].
  at::Tensor row = at::zeros({2 * channels + 1}, input.options().dtype(at::kDouble));
  if (local_count > 0) {
    const std::vector<int64_t> dims = reduced_dims(input);
    // Half and bfloat16 inputs in float32, as PyTorch's batch_norm_stats computes them:
    // a mean rounded to 8 or 11 bits, or a float16 variance past 65504, would be wrong.
    const bool reduced = input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
    auto var_mean = at::var_mean(reduced ? input.to(at::kFloat) : input, dims, /*unbiased=*/false,
                                 /*keepdim=*/false);
    row.narrow(0, 0, channels).copy_(std::get<1>(var_mean));
    row.narrow(0, channels, channels).copy_(std::get<0>(var_mean));
    row.narrow(0, 2 * channels, 1).fill_(static_cast<double>(local_count));
  }

  const at::Tensor rows = at::stack(group.all_gather(row));  // [world, 2C + 1]
  const at::Tensor means = rows.narrow(1, 0, channels);
  const at::Tensor vars = rows.narrow(1, channels, channels);
  const at::Tensor counts = rows.narrow(1, 2 * channels, 1);  // [world, 1]

  GlobalBatchStats stats;
  stats.count = static_cast<int64_t>(counts.sum().item<double>());
  if (stats.count == 0) {
    // No rank has a value: nothing to normalise. Finite placeholders, so the output
    // (empty everywhere) and the backward stay free of NaN.
    stats.mean = at::zeros({channels}, row.options());
    stats.var = at::ones({channels}, row.options());
    return stats;
  }
  const double n = static_cast<double>(stats.count);
  stats.mean = (counts * means).sum(0) / n;
  stats.var = (counts * (vars + (means - stats.mean).pow(2))).sum(0) / n;
  return stats;
}

}  // namespace detail
}  // namespace ddp
