#include "fsdp/shard_unit.h"

#include <ddp/errors.h>

#include "distributed/comm.h"
#include "distributed/common/check.h"
#include "distributed/common/host_blocks.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace ddp {
namespace detail {
namespace {

/// Note [Shards in place]: frees the bytes of `t`'s storage, keeping the StorageImpl
/// that views of it share.
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == 0) return;
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

/// Points `t`'s storage at `data` (inside a block that outlives it: not owned).
void attach_storage(const at::Tensor& t, void* data) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  s->set_data_ptr_noswap(at::DataPtr(data, t.device()));
  s->set_nbytes(bytes);
}

constexpr int64_t kAlign = 64;
int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

/// A 64-bit FNV-1a over the tensor's bytes (in its dtype, on the CPU).
uint64_t content_hash(const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kCPU).contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  uint64_t h = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

namespace {
std::shared_ptr<const FullyShardObserver>& observer_slot() {
  static std::shared_ptr<const FullyShardObserver> slot;
  return slot;
}
}  // namespace

void notify(FullyShardEvent event, const std::string& unit) {
  const auto observer = std::atomic_load(&observer_slot());
  if (observer && *observer) (*observer)(event, unit);
}

ShardUnit* unit_of_param(const at::Tensor& param) {
  // Every owner registered is a ShardUnit: only ShardUnit::shard registers.
  return static_cast<ShardUnit*>(shard_owner_of(param));
}
ShardedRef sharded_ref(const at::Tensor& param) {
  ShardUnit* unit = unit_of_param(param);
  if (!unit) return {};
  for (const ShardedParam& p : unit->params()) {
    if (p.param.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return {unit, &p};
  }
  return {};
}

std::vector<int64_t> ShardedParam::shard_sizes(int64_t n_rows) const {
  if (sizes.empty()) return {n_rows};
  std::vector<int64_t> s = sizes;
  s[0] = n_rows;
  return s;
}

ShardUnit::ShardUnit(std::string name, std::shared_ptr<ProcessGroup> pg, FullyShardOptions options)
    : name_(std::move(name)), pg_(std::move(pg)), options_(std::move(options)) {
  rank_ = pg_->rank();
  world_ = pg_->size();
}

ShardUnit::~ShardUnit() {
  for (const ShardedParam& p : params_) {
    unregister_shard_owner(p.param);
    free_storage(p.full);  // it may point into full_block_, which goes now
  }
}

at::ScalarType ShardUnit::param_dtype() const {
  if (params_.empty()) return at::kFloat;
  const auto& o = options_.mp_policy().param_dtype();
  return o && at::isFloatingType(params_[0].dtype) ? *o : params_[0].dtype;
}

at::ScalarType ShardUnit::reduce_dtype() const {
  if (params_.empty()) return at::kFloat;
  const auto& o = options_.mp_policy().reduce_dtype();
  return o ? *o : params_[0].dtype;
}

void ShardUnit::shard(std::vector<std::pair<std::string, at::Tensor>> named) {
  const c10::Device device = pg_->device();
  // Every rank's view of the unit, to compare: names, shapes, dtypes and values.
  std::ostringstream desc;
  for (auto& [name, t] : named) {
    DDP_CHECK(!t.is_sparse(), "ddp::fully_shard(", name_, "): parameter '", name,
              "' is sparse; only dense (strided) parameters can be sharded. Keep its module "
              "out of fully_shard (e.g. a sparse embedding), or make it dense.");
    DDP_CHECK(t.layout() == at::kStrided, "ddp::fully_shard(", name_, "): parameter '", name,
              "' has layout ", t.layout(), "; only strided parameters can be sharded.");
    {
      const at::ScalarType first = named.front().second.scalar_type();
      DDP_CHECK(t.scalar_type() == first, "ddp::fully_shard(", name_, "): parameters '",
                named.front().first, "' (", first, ") and '", name, "' (", t.scalar_type(),
                ") differ in dtype; one unit all-gathers one flat buffer of one dtype. "
                "Give them one dtype (module->to(dtype)) or shard their modules as "
                "separate units.");
    }
    desc << name << ' ' << t.sizes() << ' ' << t.scalar_type() << ' ' << content_hash(t) << '\n';
  }
  // Every rank of the shard group, and with HSDP every replica, holds the same values.
  auto check_equal = [&](ProcessGroup& group, const char* who) {
    const std::vector<std::string> all = group.all_gather_bytes(desc.str());
    for (int r = 1; r < group.size(); ++r) {
      if (all[r] == all[0]) continue;
      std::istringstream a(all[0]), b(all[r]);
      std::string la, lb;
      while (std::getline(a, la) && std::getline(b, lb) && la == lb) {
      }
      const std::string what = la.empty() ? lb : la;
      const std::string pname = what.substr(0, what.find(' '));
      throw MismatchError(c10::str(
          "ddp::fully_shard(", name_, "): the parameters differ between ", who, " 0 and ", who, " ",
          r, ", first at '", pname, "' (", who,
          " 0: ", la.empty() ? "<none>" : la.substr(la.find(' ') + 1), "; ", who, " ", r, ": ",
          lb.empty() ? "<none>" : lb.substr(lb.find(' ') + 1),
          " [shape dtype content hash]). Every rank must build the same model with the same "
          "initial values before fully_shard: seed the generator identically on every rank "
          "(torch::manual_seed), or load the same weights, or broadcast them from rank 0."));
    }
  };
  check_equal(*pg_, "rank");
  if (replicate_) check_equal(*replicate_, "replica");

  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& [name, t] : named) {
    ShardedParam p;
    p.name = name;
    p.param = t;
    p.sizes = t.sizes().vec();
    p.dtype = t.scalar_type();
    p.rows = t.dim() == 0 ? 1 : t.size(0);
    p.row_numel = 1;
    for (int64_t d = 1; d < t.dim(); ++d) p.row_numel *= t.size(d);
    p.chunk_rows = (p.rows + world_ - 1) / world_;
    p.local_rows = p.rows_of(rank_);
    p.offset = offset;
    p.requires_grad = t.requires_grad();
    offset += p.padded_numel();
    params_.push_back(std::move(p));
  }
  shard_numel_ = offset;
  const at::ScalarType dtype = params_.empty() ? at::kFloat : params_[0].dtype;
  flat_shard_ = at::zeros({shard_numel_}, at::TensorOptions().dtype(dtype).device(device));
  for (ShardedParam& p : params_) {
    at::Tensor data = p.param.detach().to(device).reshape({p.rows, p.row_numel});
    const int64_t n = p.local_rows * p.row_numel;
    at::Tensor slot = flat_shard_.narrow(0, p.offset, n);
    slot.copy_(data.narrow(0, p.first_row(rank_), p.local_rows).reshape({n}));
    p.shard = slot.view(p.shard_sizes(p.local_rows));
    p.full = at::empty(p.sizes, at::TensorOptions().dtype(param_dtype()).device(device));
    free_storage(p.full);
    at::Tensor grad = p.param.grad();
    p.param.set_data(p.shard);
    if (grad.defined()) {
      p.param.mutable_grad() = grad.to(device)
                                   .reshape({p.rows, p.row_numel})
                                   .narrow(0, p.first_row(rank_), p.local_rows)
                                   .reshape(p.shard_sizes(p.local_rows))
                                   .clone();
    }
    register_shard_owner(p.param, this);
  }
}

at::Tensor ShardUnit::gather_rows(const ShardedParam& p, const at::Tensor& rows) const {
  at::Tensor padded = at::zeros({p.chunk_rows, p.row_numel}, rows.options());
  if (p.local_rows > 0) {
    padded.narrow(0, 0, p.local_rows).copy_(rows.reshape({p.local_rows, p.row_numel}));
  }
  at::Tensor out = at::empty({world_ * p.chunk_rows, p.row_numel}, padded.options());
  pg_->all_gather_into_tensor(out, padded);
  return out.narrow(0, 0, p.rows).reshape(p.sizes).contiguous();
}

at::Tensor ShardUnit::rows_of_this_rank(const ShardedParam& p, const at::Tensor& full) const {
  return full.reshape({p.rows, p.row_numel})
      .narrow(0, p.first_row(rank_), p.local_rows)
      .reshape(p.shard_sizes(p.local_rows));
}

void ShardUnit::start_unshard() {
  if (unsharded_ || ag_.pending || params_.empty()) return;
  at::NoGradGuard no_grad;
  const at::ScalarType pd = param_dtype();
  ag_.input = pd == flat_shard_.scalar_type() ? flat_shard_ : flat_shard_.to(pd);
  ag_.block = HostBlock(world_ * shard_numel_ * static_cast<int64_t>(c10::elementSize(pd)),
                        flat_shard_.device());
  ag_.output = ag_.block.tensor().view(pd);
  // An all-gather copies bytes: bfloat16 travels as bytes, which every backend carries
  // (Gloo in LibTorch 1.13 has no bfloat16, and no int16).
  if (pd == at::kBFloat16) {
    at::Tensor in8 = ag_.input.view(at::kByte);
    at::Tensor out8 = ag_.output.view(at::kByte);
    ag_.work = pg_->all_gather_into_tensor_async(out8, in8);
  } else {
    ag_.work = pg_->all_gather_into_tensor_async(ag_.output, ag_.input);
  }
  ag_.pending = true;
  notify(FullyShardEvent::kAllGatherStarted, label());
}

void ShardUnit::finish_unshard() {
  if (unsharded_) return;
  if (params_.empty()) {
    unsharded_ = true;
    return;
  }
  start_unshard();
  wait_gather();
  at::NoGradGuard no_grad;
  const at::Tensor rows_of_rank = ag_.output.view({world_, shard_numel_});
  if (!full_block_.defined()) {
    int64_t bytes = 0;
    for (const ShardedParam& p : params_) bytes += aligned(p.full.numel() * p.full.element_size());
    full_block_ = HostBlock(bytes, flat_shard_.device());
  }
  auto* base = static_cast<char*>(full_block_.tensor().data_ptr());
  int64_t offset = 0;
  for (ShardedParam& p : params_) {
    attach_storage(p.full, base + offset);
    offset += aligned(p.full.numel() * p.full.element_size());
    at::Tensor full2d = p.full.view({p.rows, p.row_numel});
    for (int r = 0; r < world_; ++r) {
      const int64_t n = p.rows_of(r);
      if (n == 0) continue;
      full2d.narrow(0, p.first_row(r), n)
          .copy_(rows_of_rank[r].narrow(0, p.offset, n * p.row_numel).view({n, p.row_numel}));
    }
    p.param.set_data(p.full);
  }
  ag_.input = at::Tensor();
  ag_.output = at::Tensor();
  ag_.block.reset();  // back to the pool (Note [Host blocks])
  unsharded_ = true;
  notify(FullyShardEvent::kUnsharded, label());
}

void ShardUnit::wait_gather() {
  try {
    ag_.work.wait();
  } catch (...) {
    // A failed collective may still write into its output: it is never reused.
    ag_.block.keep_for_good();
    ag_.work = Work();
    ag_.pending = false;
    throw;
  }
  // A finished Work still holds the collective's tensors (and the backend's own
  // buffers): let them go now, not when the next step replaces it.
  ag_.work = Work();
  ag_.pending = false;
}

void ShardUnit::reshard() {
  if (ag_.pending) {  // launched but never used: still complete it, as every rank does
    wait_gather();
    ag_.input = at::Tensor();
    ag_.output = at::Tensor();
    ag_.block.reset();
  }
  if (!unsharded_) return;
  for (ShardedParam& p : params_) {
    p.param.set_data(p.shard);
    free_storage(p.full);
  }
  full_block_.reset();
  unsharded_ = false;
  notify(FullyShardEvent::kResharded, label());
}

void ShardUnit::stash_grads() {
  for (ShardedParam& p : params_) {
    if (!p.requires_grad) continue;
    at::Tensor g = p.param.grad();
    if (!g.defined()) continue;
    if (g.sizes() == p.shard.sizes() && !p.stash.defined()) {
      p.stash = g;
      p.param.mutable_grad() = at::Tensor();
    }
  }
}

void ShardUnit::reduce_grads(bool sync) {
  at::NoGradGuard no_grad;
  const at::ScalarType rdt = reduce_dtype();
  std::vector<at::Tensor> grads(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    ShardedParam& p = params_[i];
    if (!p.requires_grad) continue;
    at::Tensor g = p.param.grad();
    if (g.defined() && g.sizes() != at::IntArrayRef(p.sizes)) {
      g = at::Tensor();  // a shard's
    }
    if (g.defined()) p.param.mutable_grad() = at::Tensor();
    if (!sync) {
      if (g.defined()) {
        p.accumulated = p.accumulated.defined() ? p.accumulated.add_(g.to(rdt)) : g.to(rdt);
      }
      p.param.mutable_grad() = p.stash;
      p.stash = at::Tensor();
      continue;
    }
    if (p.accumulated.defined()) {
      g = g.defined() ? p.accumulated.add_(g.to(rdt)) : p.accumulated;
      p.accumulated = at::Tensor();
    }
    grads[i] = g;
  }
  if (!sync) return;

  rs_.reduced.clear();
  rs_.offsets.clear();
  int64_t width = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad) continue;
    rs_.reduced.push_back(i);
    rs_.offsets.push_back(width);
    width += params_[i].padded_numel();
  }
  if (rs_.reduced.empty()) return;
  rs_.width = width;
  const int64_t k = static_cast<int64_t>(rs_.reduced.size());
  // Row r: [g0 chunk r | g1 chunk r | ... | one flag per parameter]. A flag is 1 where
  // this rank has a gradient, so that after the reduction every rank knows which
  // parameters some rank used (the others keep their .grad(), as under DDP).
  // A backend that cannot reduce this dtype (Gloo in LibTorch 1.13 and bfloat16)
  // reduces in float32; the sharded gradient is cast back (Comm::reduces_dtype).
  const at::ScalarType wire = comm_of(*pg_).reduces_dtype(rdt) ? rdt : at::kFloat;
  rs_.dtype = rdt;
  const c10::Device device = flat_shard_.device();
  const int64_t esize = static_cast<int64_t>(c10::elementSize(wire));
  // The average: every rank's gradient divided by N, then summed (the bits of the
  // public AVG), the division done while copying. For dtypes that may overflow, FSDP2's
  // factors: ~sqrt(N) before the sum, the rest after it.
  double pre = 1;
  rs_.post_divide = 1;
  if (world_ > 1) {
    if (wire == at::kFloat || wire == at::kBFloat16 || wire == at::kDouble) {
      pre = world_;
    } else {
      int64_t f = 1;
      while (world_ % f == 0 && world_ / f > f) f *= 2;
      pre = static_cast<double>(f);
      rs_.post_divide = static_cast<double>(world_) / pre;
    }
  }
  const at::Tensor divisor = at::scalar_tensor(pre, at::TensorOptions().dtype(wire).device(device));
  // Note [Host blocks]: the input is the size of the unit; each full gradient is freed
  // as soon as it is copied in, so at most one parameter's full gradient and the input
  // are alive together beyond what autograd still holds.
  rs_.input_block = HostBlock(world_ * (width + k) * esize, device);
  rs_.input = rs_.input_block.tensor().view(wire).view({world_, width + k});
  rs_.input.narrow(1, width, k).zero_();
  for (int64_t j = 0; j < k; ++j) {
    const ShardedParam& p = params_[rs_.reduced[j]];
    at::Tensor g = std::move(grads[rs_.reduced[j]]);
    at::Tensor slot = rs_.input.narrow(1, rs_.offsets[j], p.padded_numel());
    if (!g.defined()) {
      slot.zero_();
      continue;
    }
    at::Tensor g2 = g.reshape({p.rows, p.row_numel});
    for (int r = 0; r < world_; ++r) {
      const int64_t n = p.rows_of(r);
      at::Tensor row = slot[r];
      if (n > 0) {
        at::Tensor dst = row.narrow(0, 0, n * p.row_numel);
        at::Tensor src = g2.narrow(0, p.first_row(r), n).reshape({n * p.row_numel});
        if (pre != 1) {
          at::div_out(dst, src.to(wire), divisor);
        } else {
          dst.copy_(src);
        }
      }
      if (n < p.chunk_rows)
        row.narrow(0, n * p.row_numel, (p.chunk_rows - n) * p.row_numel).zero_();
    }
    rs_.input.select(1, width + j).fill_(1);
  }
  // Where every gradient is added to one set aside (stash), the output is scratch: this
  // rank's own row of the input, reduced in place (every backend allows it: the other
  // ranks read only their own rows of this rank's input). Otherwise its storage becomes
  // the sharded gradients.
  const bool scratch = std::all_of(rs_.reduced.begin(), rs_.reduced.end(),
                                   [this](size_t i) { return params_[i].stash.defined(); });
  rs_.output = scratch ? rs_.input.select(0, rank_) : at::empty({width + k}, rs_.input.options());
  at::Tensor flat_in = rs_.input.view({-1});
  // The input is ours and used once: a backend may reduce in it (Gloo does).
  rs_.work = comm_of(*pg_).reduce_scatter_tensor_scratch(rs_.output, flat_in, ReduceOp::SUM);
  rs_.pending = true;
  notify(FullyShardEvent::kReduceScatterStarted, label());
}

void ShardUnit::finish_reduce() {
  while (rs_.pending) advance_reduce();
}

void ShardUnit::advance_reduce() {
  if (!rs_.pending) return;
  // The tensors a failed collective may still write stay allocated for good (see
  // wait_gather).
  auto wait_or_keep = [this](auto&& wait) {
    try {
      wait();
    } catch (...) {
      rs_.input_block.keep_for_good();
      rs_.work.reset();
      rs_.all_reduce = Work();
      rs_.all_reducing = false;
      rs_.pending = false;
      throw;
    }
  };
  at::NoGradGuard no_grad;
  if (rs_.all_reducing) {
    wait_or_keep([this] { rs_.all_reduce.wait(); });
    rs_.all_reduce = Work();
    rs_.all_reducing = false;
    rs_.output.div_(replicate_->size());
    complete_reduce();
    return;
  }
  wait_or_keep([this] { rs_.work->wait(); });
  rs_.work.reset();  // and the tensors it holds (see wait_gather)
  if (replicate_ && replicate_->size() > 1) {
    // HSDP: the shard group's sums, added to those of backwards that skipped the
    // all-reduce, then averaged across the replicas (FSDP2's all-reduce after the
    // reduce-scatter). The flags add up too; only whether they are above 0 is read.
    if (partial_.defined()) {
      DDP_CHECK(partial_.numel() == rs_.output.numel(), "ddp::fully_shard(", name_,
                "): the parameters that take gradients changed between backwards with "
                "set_requires_all_reduce(false); keep them fixed while accumulating.");
      rs_.output.add_(partial_);
      partial_ = at::Tensor();
    }
    if (!requires_all_reduce_) {
      partial_ = rs_.output.clone();
      for (size_t i : rs_.reduced) {
        ShardedParam& p = params_[i];
        p.param.mutable_grad() = p.stash;
        p.stash = at::Tensor();
      }
      rs_.pending = false;
      rs_.input = at::Tensor();
      rs_.output = at::Tensor();
      rs_.input_block.reset();
      notify(FullyShardEvent::kReduceScatterFinished, label());
      return;
    }
    // Note [The replicas' all-reduce overlaps]: launched here and waited for one unit's
    // backward later (or at the end of backward), so that it runs across hosts while the
    // next unit's reduce-scatter runs within the host, as FSDP2's all-reduce stream does.
    std::vector<at::Tensor> one{rs_.output};
    rs_.all_reduce = replicate_->all_reduce_async(one, ReduceOp::SUM);
    rs_.all_reducing = true;
    notify(FullyShardEvent::kAllReduceStarted, label());
    return;
  }
  complete_reduce();
}

void ShardUnit::complete_reduce() {
  rs_.pending = false;
  if (rs_.post_divide != 1) rs_.output.div_(rs_.post_divide);
  const int64_t k = static_cast<int64_t>(rs_.reduced.size());
  const at::Tensor flags = rs_.output.narrow(0, rs_.width, k).to(at::kCPU, at::kFloat);
  const float* used = flags.data_ptr<float>();
  for (int64_t j = 0; j < k; ++j) {
    ShardedParam& p = params_[rs_.reduced[j]];
    at::Tensor grad = p.stash;
    if (used[j] > 0) {
      // A plain tensor over the output's storage, not an autograd view of it:
      // optimizers' zero_grad() detaches gradients in place, which a view refuses.
      at::Tensor g;
      if (rs_.output.scalar_type() == p.dtype && rs_.dtype == p.dtype) {
        g = at::empty({0}, rs_.output.options());
        const auto sizes = p.shard_sizes(p.local_rows);
        g.set_(rs_.output.storage(), rs_.output.storage_offset() + rs_.offsets[j], sizes,
               c10::contiguous_strides(sizes));
      } else {
        g = rs_.output.narrow(0, rs_.offsets[j], p.local_rows * p.row_numel)
                .to(rs_.dtype)
                .to(p.dtype)
                .view(p.shard_sizes(p.local_rows));
      }
      if (grad.defined()) {
        grad.add_(g);
      } else {
        grad = g;
      }
    }
    p.param.mutable_grad() = grad;
    p.stash = at::Tensor();
  }
  rs_.input = at::Tensor();
  rs_.output = at::Tensor();
  rs_.input_block.reset();
  notify(FullyShardEvent::kReduceScatterFinished, label());
}

}  // namespace detail

const char* to_string(FullyShardEvent event) {
  switch (event) {
    case FullyShardEvent::kAllGatherStarted:
      return "all_gather_started";
    case FullyShardEvent::kUnsharded:
      return "unsharded";
    case FullyShardEvent::kResharded:
      return "resharded";
    case FullyShardEvent::kReduceScatterStarted:
      return "reduce_scatter_started";
    case FullyShardEvent::kAllReduceStarted:
      return "all_reduce_started";
    case FullyShardEvent::kReduceScatterFinished:
      return "reduce_scatter_finished";
  }
  return "unknown";
}

void set_fully_shard_observer(FullyShardObserver observer) {
  std::shared_ptr<const FullyShardObserver> next;
  if (observer) next = std::make_shared<const FullyShardObserver>(std::move(observer));
  std::atomic_store(&detail::observer_slot(), std::move(next));
}

}  // namespace ddp
