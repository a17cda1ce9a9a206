// Tensor parallelism's collectives with their gradients.
//
// Note [Uneven shards]
// A dimension of length L split over n ranks gives each ceil(L / n) positions, as
// torch.chunk and DTensor's Shard do; the last ranks get fewer, possibly none (L = 10 over
// 3 ranks: 4, 4, 2; L = 2 over 3: 1, 1, 0). The collectives move equal blocks, so a slice
// is padded to the longest before an all-gather or a reduce-scatter and cut back after;
// the padding is zeros and never reaches a result.

#include "tensor_parallel/tp_comm.h"

#include "distributed/common/check.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <numeric>

namespace ddp {
namespace detail {
namespace tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What a backward needs besides tensors.
struct CommCapsule : torch::CustomClassHolder {
  CommCapsule(std::shared_ptr<ProcessGroup> g, int64_t d, std::vector<int64_t> s)
      : group(std::move(g)), dim(d), sizes(std::move(s)) {}
  std::shared_ptr<ProcessGroup> group;
  int64_t dim;
  std::vector<int64_t> sizes;
};

void keep(AutogradContext* ctx, std::shared_ptr<ProcessGroup> group, int64_t dim,
          std::vector<int64_t> sizes) {
  ctx->saved_data["comm"] = c10::IValue::make_capsule(
      c10::make_intrusive<CommCapsule>(std::move(group), dim, std::move(sizes)));
}

const CommCapsule& kept(AutogradContext* ctx) {
  return *c10::static_intrusive_pointer_cast<CommCapsule>(ctx->saved_data["comm"].toCapsule());
}

int64_t max_of(const std::vector<int64_t>& sizes) {
  return sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
}

// `x` (dim already moved to the front) padded with zeros to `length` rows.
at::Tensor pad_rows(const at::Tensor& x, int64_t length) {
  if (x.size(0) == length) return x.contiguous();
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = length - x.size(0);
  return at::cat({x, at::zeros(shape, x.options())}, 0);
}

// All ranks' slices (along `dim`, of lengths `sizes`) put together.
at::Tensor gather(const at::Tensor& x, int64_t dim, const std::vector<int64_t>& sizes,
                  ProcessGroup& group) {
  const int64_t n = group.size();
  if (n == 1) return x;
  const int64_t longest = max_of(sizes);
  const at::Tensor front = pad_rows(x.transpose(0, dim), longest);
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] = longest * n;
  at::Tensor all = at::empty(shape, front.options());
  group.all_gather_into_tensor(all, front);
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < n; ++r) parts.push_back(all.narrow(0, r * longest, sizes[r]));
  return at::cat(parts, 0).transpose(0, dim).contiguous();
}

// The sum over the ranks of `x`, cut along `dim`: this rank's slice of lengths `sizes`.
at::Tensor reduce_scatter(const at::Tensor& x, int64_t dim, const std::vector<int64_t>& sizes,
                          ProcessGroup& group) {
  const int64_t n = group.size();
  if (n == 1) return x;
  const int64_t longest = max_of(sizes);
  const at::Tensor front = x.transpose(0, dim);
  std::vector<at::Tensor> blocks;
  int64_t start = 0;
  for (int64_t r = 0; r < n; ++r) {
    blocks.push_back(pad_rows(front.narrow(0, start, sizes[r]), longest));
    start += sizes[r];
  }
  at::Tensor input = at::cat(blocks, 0);
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = longest;
  at::Tensor out = at::empty(shape, input.options());
  group.reduce_scatter_tensor(out, input, ReduceOp::SUM);
  return out.narrow(0, 0, sizes[group.rank()]).transpose(0, dim).contiguous();
}

at::Tensor slice(const at::Tensor& x, int64_t dim, const std::vector<int64_t>& sizes, int rank) {
  const int64_t start = std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
  return x.narrow(dim, start, sizes[rank]).contiguous();
}

int64_t wrap(int64_t dim, const at::Tensor& x) {
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  DDP_CHECK(d >= 0 && d < x.dim(), "tensor parallel: dimension ", dim,
            " is out of range for a tensor of ", x.dim(), " dimensions (shape ", x.sizes(), ")");
  return d;
}

void check_total(const at::Tensor& x, int64_t dim, const std::vector<int64_t>& sizes,
                 const char* what) {
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  DDP_CHECK(x.size(dim) == total, "tensor parallel: ", what, " expected a tensor of ", total,
            " along dimension ", dim, " (the ranks' parts put together), but got shape ", x.sizes(),
            ".");
}

struct CopyTo : torch::autograd::Function<CopyTo> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            std::shared_ptr<ProcessGroup> group) {
    keep(ctx, std::move(group), 0, {});
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    at::Tensor sum = g[0].contiguous().clone();
    kept(ctx).group->all_reduce(sum, ReduceOp::SUM);
    return {sum, at::Tensor()};
  }
};

struct ReduceFrom : torch::autograd::Function<ReduceFrom> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            std::shared_ptr<ProcessGroup> group) {
    at::Tensor sum = x.contiguous().clone();
    group->all_reduce(sum, ReduceOp::SUM);
    return sum;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {g[0], at::Tensor()};
  }
};

// What a slice-moving function does, forward or backward, along a dimension.
enum class Move { kGather, kSlice, kReduceScatter };

at::Tensor apply_move(Move move, const at::Tensor& x, int64_t dim,
                      const std::vector<int64_t>& sizes, ProcessGroup& group) {
  switch (move) {
    case Move::kGather:
      return gather(x.contiguous(), dim, sizes, group);
    case Move::kSlice:
      return slice(x, dim, sizes, group.rank());
    case Move::kReduceScatter:
      return reduce_scatter(x.contiguous(), dim, sizes, group);
  }
  return x;
}

// Forward moves the tensor one way along `dim`, backward moves its gradient the other:
// gather / slice, slice / gather, reduce-scatter / gather, gather / reduce-scatter.
template <Move Forward, Move Backward>
struct MoveAlong : torch::autograd::Function<MoveAlong<Forward, Backward>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim,
                            std::vector<int64_t> sizes, std::shared_ptr<ProcessGroup> group) {
    at::Tensor out = apply_move(Forward, x, dim, sizes, *group);
    keep(ctx, std::move(group), dim, std::move(sizes));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const CommCapsule& c = kept(ctx);
    return {apply_move(Backward, g[0], c.dim, c.sizes, *c.group), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

using GatherFrom = MoveAlong<Move::kGather, Move::kSlice>;
using SplitTo = MoveAlong<Move::kSlice, Move::kGather>;
using ReduceScatterTo = MoveAlong<Move::kReduceScatter, Move::kGather>;
using AllGatherTo = MoveAlong<Move::kGather, Move::kReduceScatter>;

}  // namespace

at::Tensor gather_along(const at::Tensor& x, int64_t dim, const std::vector<int64_t>& sizes,
                        ProcessGroup& group) {
  return gather(x.contiguous(), wrap(dim, x), sizes, group);
}

std::vector<int64_t> chunk_sizes(int64_t total, int64_t n) {
  const int64_t each = n > 0 ? (total + n - 1) / n : 0;
  std::vector<int64_t> out;
  for (int64_t r = 0; r < n; ++r) {
    out.push_back(std::max<int64_t>(0, std::min(each, total - r * each)));
  }
  return out;
}

int64_t chunk_offset(int64_t total, int64_t n, int64_t r) {
  const int64_t each = n > 0 ? (total + n - 1) / n : 0;
  return std::min(total, r * each);
}

std::vector<int64_t> exchange_sizes(ProcessGroup& group, const at::Tensor& local, int64_t dim) {
  const int64_t d = wrap(dim, local);
  if (group.size() == 1) return {local.size(d)};
  at::Tensor mine = at::full({1}, local.size(d), at::kLong);
  at::Tensor all = at::empty({group.size()}, at::kLong);
  group.all_gather_into_tensor(all, mine);
  return std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
}

at::Tensor copy_to(const at::Tensor& x, std::shared_ptr<ProcessGroup> group) {
  return CopyTo::apply(x, std::move(group));
}

at::Tensor reduce_from(const at::Tensor& x, std::shared_ptr<ProcessGroup> group) {
  return ReduceFrom::apply(x, std::move(group));
}

at::Tensor gather_from(const at::Tensor& x, int64_t dim, std::vector<int64_t> sizes,
                       std::shared_ptr<ProcessGroup> group) {
  const int64_t d = wrap(dim, x);
  DDP_CHECK(x.size(d) == sizes[static_cast<size_t>(group->rank())],
            "tensor parallel: expected this rank's slice of ",
            sizes[static_cast<size_t>(group->rank())], " along dimension ", d, ", but got shape ",
            x.sizes(), " on rank ", group->rank(), ".");
  return GatherFrom::apply(x, d, std::move(sizes), std::move(group));
}

at::Tensor split_to(const at::Tensor& x, int64_t dim, std::vector<int64_t> sizes,
                    std::shared_ptr<ProcessGroup> group) {
  const int64_t d = wrap(dim, x);
  check_total(x, d, sizes, "splitting a whole input:");
  return SplitTo::apply(x, d, std::move(sizes), std::move(group));
}

at::Tensor reduce_scatter_to(const at::Tensor& x, int64_t dim, std::vector<int64_t> sizes,
                             std::shared_ptr<ProcessGroup> group) {
  const int64_t d = wrap(dim, x);
  check_total(x, d, sizes, "reduce-scattering an output:");
  return ReduceScatterTo::apply(x, d, std::move(sizes), std::move(group));
}

at::Tensor all_gather_to(const at::Tensor& x, int64_t dim, std::vector<int64_t> sizes,
                         std::shared_ptr<ProcessGroup> group) {
  const int64_t d = wrap(dim, x);
  return AllGatherTo::apply(x, d, std::move(sizes), std::move(group));
}

}  // namespace tp
}  // namespace detail
}  // namespace ddp
