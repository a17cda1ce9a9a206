// PowerSGD (include/ddp/parallel/powersgd.h), step for step as PyTorch's powerSGD_hook
// (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py), so that the same state
// gives the same parameters.
//
// Note [PowerSGD's order of collectives]
// Per compressed bucket there are three all-reduces: the uncompressed tensors, P, then
// Q, and Q needs the reduced P. PyTorch launches P and Q from callbacks on its
// communication thread; here every collective is launched from the backward thread, in
// bucket order, so that every rank issues them in the same order whatever else is in
// flight (a later bucket's, or DDP's own use counts). So the hook waits for P's
// all-reduce before it returns; Q's all-reduce and the decompression run while backward
// goes on, and DDP waits for them at its end as for any bucket.

#include <ddp/parallel/powersgd.h>

#include "distributed/common/check.h"
#include "parallel/bucket.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/jit_type.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace ddp {
namespace detail {

// ---- numpy's legacy RandomState -------------------------------------------------------

NumpyRandomState::NumpyRandomState(uint32_t seed) {
  // mt19937_seed (numpy/random/src/mt19937): init_genrand.
  mt_[0] = seed;
  for (int i = 1; i < 624; ++i) {
    mt_[i] = 1812433253U * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  }
  pos_ = 624;
}

uint32_t NumpyRandomState::next() {
  if (pos_ >= 624) {
    constexpr uint32_t kUpper = 0x80000000U, kLower = 0x7fffffffU, kMatrix = 0x9908b0dfU;
    for (int i = 0; i < 624; ++i) {
      const uint32_t y = (mt_[i] & kUpper) | (mt_[(i + 1) % 624] & kLower);
      mt_[i] = mt_[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1U) ? kMatrix : 0U);
    }
    pos_ = 0;
  }
  uint32_t y = mt_[pos_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= y >> 18;
  return y;
}

int64_t NumpyRandomState::randint(int64_t high) {
  DDP_CHECK(high >= 1 && high <= (int64_t(1) << 32),
            "NumpyRandomState::randint: high must be "
            "in [1, 2^32], got ",
            high);
  const uint64_t range = static_cast<uint64_t>(high - 1);
  if (range == 0) return 0;
  if (range == 0xffffffffULL) return next();
  // Masked rejection sampling (numpy's legacy bounded integers, use_masked=True).
  uint64_t mask = range;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  uint64_t value;
  while ((value = (next() & mask)) > range) {
  }
  return static_cast<int64_t>(value);
}

std::vector<int64_t> NumpyRandomState::state() const {
  std::vector<int64_t> out(mt_, mt_ + 624);
  out.push_back(pos_);
  return out;
}

void NumpyRandomState::set_state(const std::vector<int64_t>& state) {
  DDP_CHECK(state.size() == 625 && state[624] >= 0 && state[624] <= 624,
            "PowerSGDState::load_state_dict: 'rng' must hold 625 values (624 Mersenne Twister "
            "words and a position in 0..624), got ",
            state.size());
  for (int i = 0; i < 624; ++i) mt_[i] = static_cast<uint32_t>(state[i]);
  pos_ = static_cast<int>(state[624]);
}

// Note [PowerSGD's state per parameter]
// PyTorch keeps the error and the P and Q memories per bucket index, as flat tensors in
// the bucket's layout. Here they are kept per parameter: the error as the parameter's
// slice of the bucket's error, Q as the matrix's own (m x r) part (P is recomputed from
// M and Q before it is read, so it need not be kept). Within a job this is the same
// arithmetic, element for element. A resumed job's DDP starts from its initial bucket
// layout and rebuilds it after the first iteration, as at the start, so a state kept
// per bucket would be applied to other gradients for one iteration; kept per parameter,
// it applies to the same ones whatever the layout, and a resumed run continues
// bit-identically (with warm start; without it, each iteration's random Qs are drawn in
// bucket order, as PyTorch draws them, and the first iteration after a resume draws them
// in DDP's initial order).
struct PowerSGDParamState {
  at::Tensor param;  // keeps the key (its TensorImpl) alive
  at::Tensor error;  // this rank's error feedback, shaped as the parameter
  at::Tensor q;      // the warm-started Q, [m, r]
};

}  // namespace detail

// ---- the state ------------------------------------------------------------------------

PowerSGDState::PowerSGDState(const PowerSGDState& other) { *this = other; }

PowerSGDState& PowerSGDState::operator=(const PowerSGDState& other) {
  if (this == &other) return *this;
  std::unique_lock<std::mutex> a(mutex_, std::defer_lock), b(other.mutex_, std::defer_lock);
  std::lock(a, b);
  process_group_ = other.process_group_;
  matrix_approximation_rank_ = other.matrix_approximation_rank_;
  start_powerSGD_iter_ = other.start_powerSGD_iter_;
  min_compression_rate_ = other.min_compression_rate_;
  use_error_feedback_ = other.use_error_feedback_;
  warm_start_ = other.warm_start_;
  orthogonalization_epsilon_ = other.orthogonalization_epsilon_;
  random_seed_ = other.random_seed_;
  batch_tensors_with_same_shape_ = other.batch_tensors_with_same_shape_;
  iter_ = other.iter_;
  numel_before_ = other.numel_before_;
  numel_after_ = other.numel_after_;
  rng_ = other.rng_;
  params_.clear();
  for (const auto& [key, param] : other.params_) {
    auto copy = std::make_shared<detail::PowerSGDParamState>();
    copy->param = param->param;
    if (param->error.defined()) copy->error = param->error.clone();
    if (param->q.defined()) copy->q = param->q.clone();
    params_[key] = std::move(copy);
  }
  return *this;
}

int64_t PowerSGDState::iter() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return iter_;
}
int64_t PowerSGDState::numel_before_compression() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return numel_before_;
}
int64_t PowerSGDState::numel_after_compression() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return numel_after_;
}
double PowerSGDState::compression_rate() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return numel_after_ > 0 ? double(numel_before_) / double(numel_after_) : 0.0;
}

void PowerSGDState::validate() const {
  DDP_CHECK(matrix_approximation_rank_ >= 1,
            "PowerSGDState: matrix_approximation_rank must be >= 1 (the rank of each "
            "low-rank approximation), got ",
            matrix_approximation_rank_,
            ". Use 1 to 4 typically; higher keeps more of the gradient.");
  DDP_CHECK(!((use_error_feedback_ || warm_start_) && start_powerSGD_iter_ <= 1),
            "PowerSGDState: expected start_powerSGD_iter > 1 when use_error_feedback or "
            "warm_start is on, got ",
            start_powerSGD_iter_,
            ": PowerSGD can only be applied after the first two iterations in DDP (DDP "
            "may rebuild its buckets after the first). Set start_powerSGD_iter to 2 or more, "
            "or turn both off.");
  DDP_CHECK(min_compression_rate_ > 0,
            "PowerSGDState: min_compression_rate must be positive, "
            "got ",
            min_compression_rate_);
  DDP_CHECK(orthogonalization_epsilon_ >= 0,
            "PowerSGDState: orthogonalization_epsilon must be >= 0, got ",
            orthogonalization_epsilon_);
  DDP_CHECK(random_seed_ <= 0xffffffffULL,
            "PowerSGDState: random_seed must be in 0..2^32-1 "
            "(numpy.random.RandomState's range, which PyTorch seeds), got ",
            random_seed_);
}

c10::impl::GenericDict PowerSGDState::state_dict(const torch::nn::Module& model) const {
  std::lock_guard<std::mutex> lock(mutex_);
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("iter", iter_);
  out.insert("numel_before_compression", numel_before_);
  out.insert("numel_after_compression", numel_after_);
  const auto rng = rng_ ? rng_->state() : detail::NumpyRandomState(uint32_t(random_seed_)).state();
  out.insert("rng", at::tensor(rng, at::kLong));
  for (const auto& item : model.named_parameters()) {
    auto it = params_.find(item.value().unsafeGetTensorImpl());
    if (it == params_.end()) continue;
    if (it->second->error.defined())
      out.insert("error." + item.key(), it->second->error.cpu().clone());
    if (it->second->q.defined()) out.insert("q." + item.key(), it->second->q.cpu().clone());
  }
  return out;
}

void PowerSGDState::load_state_dict(const c10::impl::GenericDict& state,
                                    const torch::nn::Module& model) {
  const std::string where = "PowerSGDState::load_state_dict";
  auto get = [&](const std::string& key) {
    auto it = state.find(key);
    DDP_CHECK(it != state.end(), where, ": no '", key,
              "': expected a dict written by PowerSGDState::state_dict()");
    return it->value();
  };
  const int64_t iter = get("iter").toInt();
  const int64_t before = get("numel_before_compression").toInt();
  const int64_t after = get("numel_after_compression").toInt();
  const at::Tensor rng_tensor = get("rng").toTensor().to(at::kLong).contiguous();
  std::vector<int64_t> rng(rng_tensor.data_ptr<int64_t>(),
                           rng_tensor.data_ptr<int64_t>() + rng_tensor.numel());
  detail::NumpyRandomState generator;
  generator.set_state(rng);
  std::map<std::string, at::Tensor> by_name;
  for (const auto& item : model.named_parameters()) by_name[item.key()] = item.value();
  std::map<const void*, std::shared_ptr<detail::PowerSGDParamState>> params;
  for (const auto& item : state) {
    const std::string key = item.key().toStringRef();
    const auto dot = key.find('.');
    if (dot == std::string::npos) continue;
    const std::string kind = key.substr(0, dot), name = key.substr(dot + 1);
    DDP_CHECK(kind == "error" || kind == "q", where, ": unexpected key '", key, "'");
    auto found = by_name.find(name);
    DDP_CHECK(found != by_name.end(), where, ": '", key, "' names a parameter '", name,
              "' that the model lacks: load the state of the same model");
    const at::Tensor& param = found->second;
    const at::Tensor t = item.value().toTensor();
    auto& slot = params[param.unsafeGetTensorImpl()];
    if (!slot) {
      slot = std::make_shared<detail::PowerSGDParamState>();
      slot->param = param;
    }
    if (kind == "error") {
      DDP_CHECK(t.numel() == param.numel(), where, ": '", key, "' has ", t.numel(),
                " elements, the parameter ", param.numel());
      slot->error = t.to(param.device(), param.scalar_type()).reshape(param.sizes()).clone();
    } else {
      const int64_t rows = param.dim() > 0 ? param.size(0) : 1;
      const int64_t m = param.numel() / std::max<int64_t>(rows, 1);
      const int64_t r = std::min({rows, m, matrix_approximation_rank_});
      DDP_CHECK(t.dim() == 2 && t.size(0) == m && t.size(1) == r, where, ": '", key, "' has shape ",
                t.sizes(), ", expected [", m, ", ", r, "] for matrix_approximation_rank ",
                matrix_approximation_rank_, ": resume with the rank the state was saved with");
      slot->q = t.to(param.device(), param.scalar_type()).clone();
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  iter_ = iter;
  numel_before_ = before;
  numel_after_ = after;
  rng_ = generator;
  params_ = std::move(params);
}

// ---- the hook -------------------------------------------------------------------------

namespace {

// _orthogonalize_gram_schmidt: columns of each matrix of the batch [B, n, r], in place.
void orthogonalize_gram_schmidt(at::Tensor& matrices, double epsilon) {
  const int64_t cols = matrices.size(2);
  for (int64_t i = 0; i < cols; ++i) {
    at::Tensor col = matrices.narrow(2, i, 1);
    at::Tensor norm = at::linalg_vector_norm(col, 2, at::IntArrayRef{1}, true, c10::nullopt);
    if (epsilon == 0) {
      col.div_(norm);
    } else {
      col.div_(norm + epsilon);
    }
    if (i + 1 < cols) {
      at::Tensor rest = matrices.narrow(2, i + 1, cols - i - 1);
      rest.sub_(at::sum(col * rest, {1}, true) * col);
    }
  }
}

// _orthogonalize: Gram-Schmidt for rank <= 2 or half precision, else QR in place.
void orthogonalize(at::Tensor& matrices, double epsilon) {
  const int64_t rank = matrices.size(2);
  const auto dtype = matrices.scalar_type();
  if (rank <= 2 || dtype == at::kHalf || dtype == at::kBFloat16) {
    orthogonalize_gram_schmidt(matrices, epsilon);
  } else {
    at::Tensor r = at::empty({matrices.size(0), rank, rank}, matrices.options());
    at::linalg_qr_out(matrices, r, matrices);
  }
}

// One product of the hook: a matrix of the bucket, or a stack of matrices of one shape.
struct Batch {
  at::Tensor matrices;                // [B, n, m]: views of the bucket, or a stacked copy
  std::vector<at::Tensor> originals;  // when stacked: where to copy the result back
  at::Tensor p, q;                    // views of the flat P and Q
  std::vector<std::shared_ptr<detail::PowerSGDParamState>> states;  // one per matrix
};

}  // namespace

class PowerSGDHook final : public CommHook {
 public:
  explicit PowerSGDHook(std::shared_ptr<PowerSGDState> state) : state_(std::move(state)) {}

  std::string name() const override { return "powersgd"; }

  c10::intrusive_ptr<c10::ivalue::Future> run_hook(GradBucket& bucket) override;

 private:
  std::shared_ptr<PowerSGDState> state_;
  // Per bucket, the gradients before compression, kept between iterations: a fresh
  // buffer each time would cost the kernel's page zeroing on every iteration. Only
  // run_hook touches it, on the backward thread, before DDP waits for the bucket.
  std::map<size_t, at::Tensor> scratch_;
};

c10::intrusive_ptr<c10::ivalue::Future> PowerSGDHook::run_hook(GradBucket& bucket) {
  PowerSGDState& s = *state_;
  ProcessGroup& pg = s.process_group() ? *s.process_group() : bucket.process_group();
  const int world = pg.size();
  at::Tensor input = bucket.buffer();
  const bool last = bucket.is_last();

  std::unique_lock<std::mutex> lock(s.mutex_);
  if (s.iter_ < s.start_powerSGD_iter_) {
    // default._allreduce_fut: divide first, then sum.
    if (last) ++s.iter_;
    lock.unlock();
    input.div_(world);
    std::vector<at::Tensor> tensors{input};  // bytes sent: the buffer's, the default
    return pg.all_reduce_async(tensors, ReduceOp::SUM)
        .future()
        ->then([input](c10::ivalue::Future&) -> c10::IValue { return input; },
               c10::TensorType::get());
  }

  // Note [PowerSGD's state per parameter].
  std::vector<at::Tensor> gradients = bucket.gradients();
  const std::vector<at::Tensor>& parameters = bucket.parameters();
  std::vector<std::shared_ptr<detail::PowerSGDParamState>> states;
  std::vector<int64_t> offsets;  // of each gradient in the bucket's buffer
  for (size_t k = 0; k < parameters.size(); ++k) {
    auto& slot = s.params_[parameters[k].unsafeGetTensorImpl()];
    if (!slot) {
      slot = std::make_shared<detail::PowerSGDParamState>();
      slot->param = parameters[k];
    }
    states.push_back(slot);
    offsets.push_back(gradients[k].storage_offset() - input.storage_offset());
  }
  const auto options = input.options();
  at::Tensor input_copy;
  if (s.use_error_feedback_) {
    // PyTorch adds the bucket's flat error to the flat buffer; per parameter it is the
    // same additions, element for element, in one pass.
    for (size_t k = 0; k < states.size(); ++k) {
      if (states[k]->error.defined()) gradients[k].add_(states[k]->error);
    }
    // Kept between iterations (not in state_dict): a fresh buffer each time would cost
    // the kernel's page zeroing on every iteration.
    at::Tensor& scratch = scratch_[bucket.index()];
    if (!scratch.defined() || scratch.numel() != input.numel() ||
        scratch.options().dtype() != input.options().dtype() ||
        scratch.device() != input.device()) {
      scratch = at::empty_like(input);
    }
    scratch.copy_(input);
    input_copy = scratch;
  }

  // Split: matrices worth compressing, and the rest.
  std::vector<at::Tensor> uncompressed;
  std::vector<std::pair<at::Tensor, size_t>> to_compress;  // matrix, index in the bucket
  for (size_t k = 0; k < gradients.size(); ++k) {
    const at::Tensor& g = gradients[k];
    if (g.dim() == 0) {  // no rows to view as a matrix
      uncompressed.push_back(g);
      s.numel_before_ += 1;
      s.numel_after_ += 1;
      continue;
    }
    at::Tensor matrix = g.view({g.size(0), -1});
    const int64_t n = matrix.size(0), m = matrix.size(1);
    const int64_t r = std::min({n, m, s.matrix_approximation_rank_});
    const int64_t full = n * m, compressed = (n + m) * r;
    s.numel_before_ += full;
    if (double(compressed) * s.min_compression_rate_ < double(full)) {
      to_compress.emplace_back(matrix, k);
      s.numel_after_ += compressed;
    } else {
      uncompressed.push_back(g);
      s.numel_after_ += full;
    }
  }
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : uncompressed) flat.push_back(t.reshape({-1}));
  at::Tensor uncompressed_memory = flat.empty() ? at::empty({0}, options) : at::cat(flat);

  // Matrices grouped by shape, in order of each shape's first appearance (Python's dict),
  // one at a time or stacked per shape.
  std::vector<std::pair<std::vector<int64_t>, std::vector<size_t>>> by_shape;
  for (size_t c = 0; c < to_compress.size(); ++c) {
    const std::vector<int64_t> shape = to_compress[c].first.sizes().vec();
    auto it = std::find_if(by_shape.begin(), by_shape.end(),
                           [&](const auto& entry) { return entry.first == shape; });
    if (it == by_shape.end()) {
      by_shape.emplace_back(shape, std::vector<size_t>{c});
    } else {
      it->second.push_back(c);
    }
  }
  std::vector<Batch> batches;
  for (auto& entry : by_shape) {
    const std::vector<size_t>& members = entry.second;
    auto state_of = [&](size_t c) { return states[to_compress[c].second]; };
    if (s.batch_tensors_with_same_shape_ && members.size() > 1) {
      Batch b;
      std::vector<at::Tensor> tensors;
      for (size_t c : members) {
        tensors.push_back(to_compress[c].first);
        b.states.push_back(state_of(c));
      }
      b.matrices = at::stack(tensors);
      b.originals = tensors;
      batches.push_back(std::move(b));
    } else {
      for (size_t c : members) {
        Batch b;
        b.matrices = to_compress[c].first.unsqueeze(0);
        b.states.push_back(state_of(c));
        batches.push_back(std::move(b));
      }
    }
  }
  int64_t total_p = 0, total_q = 0;
  for (const Batch& b : batches) {
    const int64_t count = b.matrices.size(0), n = b.matrices.size(1), m = b.matrices.size(2);
    const int64_t r = std::min({n, m, s.matrix_approximation_rank_});
    total_p += count * n * r;
    total_q += count * m * r;
  }
  at::Tensor p_memory = at::empty({total_p}, options);
  at::Tensor q_memory = at::empty({total_q}, options);
  bool randomize = !s.warm_start_;
  int64_t p_at = 0, q_at = 0;
  for (Batch& b : batches) {
    const int64_t count = b.matrices.size(0), n = b.matrices.size(1), m = b.matrices.size(2);
    const int64_t r = std::min({n, m, s.matrix_approximation_rank_});
    b.p = p_memory.narrow(0, p_at, count * n * r).view({count, n, r});
    b.q = q_memory.narrow(0, q_at, count * m * r).view({count, m, r});
    p_at += count * n * r;
    q_at += count * m * r;
    for (const auto& st : b.states)
      if (!st->q.defined() || st->q.numel() != m * r) randomize = true;
  }

  const double epsilon = s.orthogonalization_epsilon_;
  if (!randomize) {
    for (Batch& b : batches) {
      for (size_t i = 0; i < b.states.size(); ++i) b.q[int64_t(i)].copy_(b.states[i]->q);
      orthogonalize(b.q, epsilon);
    }
  } else {
    // torch.manual_seed(state.rng.randint(1_000_000_000)), then torch.randn on the CPU.
    if (!s.rng_) s.rng_.emplace(static_cast<uint32_t>(s.random_seed_));
    const int64_t seed = s.rng_->randint(1000000000);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
    for (Batch& b : batches) {
      b.q.copy_(at::randn(b.q.sizes(), generator, at::TensorOptions().dtype(options.dtype())));
      orthogonalize(b.q, epsilon);
    }
  }
  for (Batch& b : batches) at::bmm_out(b.p, b.matrices, b.q);
  const bool error_feedback = s.use_error_feedback_;
  const bool warm_start = s.warm_start_;
  lock.unlock();

  bucket.set_bytes_sent((uncompressed_memory.numel() + total_p + total_q) *
                        static_cast<int64_t>(input.element_size()));
  // Note [PowerSGD's order of collectives]: the uncompressed tensors and P now, Q after
  // P is back.
  std::vector<at::Tensor> u_tensors{uncompressed_memory};
  Work u_work = pg.all_reduce_async(u_tensors, ReduceOp::SUM);
  std::vector<at::Tensor> p_tensors{p_memory};
  Work p_work = pg.all_reduce_async(p_tensors, ReduceOp::SUM);
  u_work.wait();
  {
    at::Tensor reduced = detail::hook_result(u_work.future()->value()).div_(world);
    int64_t at = 0;
    for (at::Tensor& t : uncompressed) {
      t.copy_(reduced.narrow(0, at, t.numel()).view_as(t));
      at += t.numel();
    }
  }
  p_work.wait();
  for (Batch& b : batches) {
    orthogonalize(b.p, epsilon);
    at::bmm_out(b.q, b.matrices.transpose(1, 2), b.p);
  }
  std::vector<at::Tensor> q_tensors{q_memory};
  Work q_work = pg.all_reduce_async(q_tensors, ReduceOp::SUM);

  auto state = state_;
  return q_work.future()->then(
      [state, batches, states, offsets, gradients, q_memory, input, input_copy, world,
       error_feedback, warm_start, last](c10::ivalue::Future&) -> c10::IValue {
        q_memory.div_(world);
        for (const Batch& b : batches) {
          at::Tensor out = b.matrices;
          at::bmm_out(out, b.p, b.q.transpose(1, 2));
          for (size_t i = 0; i < b.originals.size(); ++i) {
            at::Tensor original = b.originals[i];
            original.copy_(b.matrices[static_cast<int64_t>(i)]);
          }
        }
        std::lock_guard<std::mutex> guard(state->mutex_);
        if (error_feedback) {
          // Into each parameter's own error tensor, reused from the last iteration.
          for (size_t k = 0; k < states.size(); ++k) {
            const at::Tensor before =
                input_copy.narrow(0, offsets[k], gradients[k].numel()).view(gradients[k].sizes());
            at::Tensor& error = states[k]->error;
            if (!error.defined() || !error.sizes().equals(gradients[k].sizes()) ||
                error.scalar_type() != gradients[k].scalar_type()) {
              error = at::empty_like(gradients[k], at::MemoryFormat::Contiguous);
            }
            at::sub_out(error, before, gradients[k]);
          }
        }
        for (const Batch& b : batches) {
          for (size_t i = 0; i < b.states.size(); ++i) {
            b.states[i]->q = warm_start ? b.q[int64_t(i)].clone() : at::Tensor();
          }
        }
        if (last) ++state->iter_;
        return input;
      },
      c10::TensorType::get());
}

std::shared_ptr<CommHook> powersgd_hook(std::shared_ptr<PowerSGDState> state) {
  DDP_CHECK(state, "powersgd_hook: the state is null; pass std::make_shared<ddp::PowerSGDState>()");
  state->validate();
  return std::make_shared<PowerSGDHook>(std::move(state));
}

}  // namespace ddp
