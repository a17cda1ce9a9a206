#include <ddp/parallel/comm_hooks.h>

#include "parallel/bucket.h"
#include "distributed/comm.h"
#include "distributed/common/check.h"

#include <ATen/ATen.h>
#include <ATen/core/jit_type.h>

#include <optional>
#include <utility>

namespace ddp {

GradBucket::GradBucket(size_t index, size_t num_buckets, at::Tensor buffer,
                       std::vector<at::Tensor> parameters, std::vector<int64_t> offsets,
                       ProcessGroup& process_group)
    : index_(index),
      num_buckets_(num_buckets),
      buffer_(std::move(buffer)),
      parameters_(std::move(parameters)),
      offsets_(std::move(offsets)),
      process_group_(&process_group) {}

std::vector<at::Tensor> GradBucket::gradients() const {
  std::vector<at::Tensor> out;
  out.reserve(parameters_.size());
  for (size_t k = 0; k < parameters_.size(); ++k) {
    out.push_back(detail::bucket_view(buffer_, offsets_[k], parameters_[k]));
  }
  return out;
}

namespace detail {
at::Tensor hook_result(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor();
  if (value.isTensorList()) {
    auto list = value.toTensorVector();
    if (!list.empty()) return list[0];
  }
  if (value.isList()) {
    auto list = value.toList();
    if (list.size() > 0 && list.get(0).isTensor()) return list.get(0).toTensor();
  }
  return at::Tensor();
}
}  // namespace detail

int64_t GradBucket::bytes_sent() const {
  return bytes_sent_ >= 0 ? bytes_sent_
                          : buffer_.numel() * static_cast<int64_t>(buffer_.element_size());
}

namespace {

class FunctionHook final : public CommHook {
 public:
  FunctionHook(CommHookFn fn, std::string name) : fn_(std::move(fn)), name_(std::move(name)) {}
  c10::intrusive_ptr<c10::ivalue::Future> run_hook(GradBucket& bucket) override {
    return fn_(bucket);
  }
  std::string name() const override { return name_; }

 private:
  CommHookFn fn_;
  std::string name_;
};

// Compress to `wire` dtype (divided by the world size), all-reduce, decompress into the
// bucket. `transport`, when set, is the dtype actually sent (see bf16 on Gloo).
c10::intrusive_ptr<c10::ivalue::Future> compressed_allreduce(
    GradBucket& bucket, at::ScalarType wire, std::optional<at::ScalarType> transport) {
  ProcessGroup& pg = bucket.process_group();
  at::Tensor compressed = bucket.buffer().to(wire).div_(pg.size());
  std::vector<at::Tensor> tensors{transport ? compressed.to(*transport) : compressed};
  bucket.set_bytes_sent(tensors[0].numel() * static_cast<int64_t>(tensors[0].element_size()));
  auto future = pg.all_reduce_async(tensors, ReduceOp::SUM).future();
  at::Tensor buffer = bucket.buffer();
  return future->then(
      [buffer, wire](c10::ivalue::Future& done) -> c10::IValue {
        // Rounding the sum to `wire` again is a no-op when it travelled as `wire`.
        buffer.copy_(detail::hook_result(done.value()).to(wire));
        return buffer;
      },
      c10::TensorType::get());
}

}  // namespace

std::shared_ptr<CommHook> make_comm_hook(CommHookFn fn, std::string name) {
  DDP_CHECK(fn, "make_comm_hook got an empty function");
  return std::make_shared<FunctionHook>(std::move(fn), std::move(name));
}

namespace comm_hooks {

std::shared_ptr<CommHook> allreduce_hook() {
  return make_comm_hook(
      [](GradBucket& bucket) {
        std::vector<at::Tensor> tensors{bucket.buffer()};
        return bucket.process_group().all_reduce_async(tensors, ReduceOp::AVG).future();
      },
      "allreduce");
}

std::shared_ptr<CommHook> fp16_compress_hook() {
  return make_comm_hook(
      [](GradBucket& bucket) { return compressed_allreduce(bucket, at::kHalf, std::nullopt); },
      "fp16_compress");
}

std::shared_ptr<CommHook> bf16_compress_hook() {
  return make_comm_hook(
      [](GradBucket& bucket) {
        // A group that cannot reduce bfloat16 (Gloo) reduces the rounded values in float.
        const bool native = detail::comm_of(bucket.process_group()).reduces_dtype(at::kBFloat16);
        return compressed_allreduce(bucket, at::kBFloat16,
                                    native ? std::nullopt
                                           : std::optional<at::ScalarType>(at::kFloat));
      },
      "bf16_compress");
}

}  // namespace comm_hooks
}  // namespace ddp
