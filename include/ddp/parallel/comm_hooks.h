#pragma once

// Communication hooks: how DistributedDataParallel reduces one bucket of gradients.
// A hook takes a GradBucket, launches the reduction of its flat buffer and returns a
// future that completes with the averaged flat tensor, as PyTorch's C++
// CommHookInterface does. DDP waits for every bucket's future at the end of backward
// and writes the result back into the parameters' gradients.
//
// Example:
//   dmodel->register_comm_hook(ddp::comm_hooks::fp16_compress_hook());
//   // or your own:
//   dmodel->register_comm_hook([](ddp::GradBucket& bucket) {
//     std::vector<at::Tensor> tensors{bucket.buffer()};
//     return bucket.process_group().all_reduce_async(tensors, ddp::ReduceOp::AVG).future();
//   });

#include <ddp/distributed/process_group.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

/// One bucket of gradients, handed to a comm hook.
class GradBucket {
 public:
  GradBucket(size_t index, size_t num_buckets, at::Tensor buffer,
             std::vector<at::Tensor> parameters, std::vector<int64_t> offsets,
             ProcessGroup& process_group);

  /// Position of this bucket in launch order (0 is launched first).
  size_t index() const { return index_; }
  /// Whether this is the last bucket of the iteration.
  bool is_last() const { return index_ + 1 == num_buckets_; }
  /// The bucket's gradients, flattened into one 1-D tensor of one dtype. Holds each
  /// rank's local (summed, not yet averaged) gradients when the hook runs. The hook
  /// may reduce it in place and return it, or return another tensor of the same numel.
  const at::Tensor& buffer() const { return buffer_; }
  /// Per parameter, a view of buffer() shaped like the parameter.
  std::vector<at::Tensor> gradients() const;
  /// The parameters whose gradients are in this bucket, in buffer order.
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  /// The group DDP reduces over.
  ProcessGroup& process_group() const { return *process_group_; }
  /// What the hook's collectives are given for this bucket, in bytes, for
  /// IterationStats::bytes_sent; a hook that compresses says so here. Unset: the
  /// buffer's size.
  void set_bytes_sent(int64_t bytes) { bytes_sent_ = bytes; }
  int64_t bytes_sent() const;

 private:
  size_t index_;
  size_t num_buckets_;
  at::Tensor buffer_;
  std::vector<at::Tensor> parameters_;
  std::vector<int64_t> offsets_;
  ProcessGroup* process_group_;
  int64_t bytes_sent_ = -1;
};

/// A communication hook: reduces one bucket. The returned future must complete with
/// the averaged flat buffer, as a Tensor or a one-element list of Tensor (what
/// Work::future() yields). run_hook is called on the backward thread while DDP holds
/// its bookkeeping lock: launch the work and return, do not wait on it, and do not call
/// back into the DDP model.
class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual c10::intrusive_ptr<c10::ivalue::Future> run_hook(GradBucket& bucket) = 0;
  /// A short name, for traces and error messages.
  virtual std::string name() const { return "custom"; }
};

/// A hook as a function.
using CommHookFn = std::function<c10::intrusive_ptr<c10::ivalue::Future>(GradBucket&)>;

/// Wraps a function as a CommHook.
std::shared_ptr<CommHook> make_comm_hook(CommHookFn fn, std::string name = "custom");

namespace comm_hooks {

/// The default: all-reduce the bucket and divide by the world size (dividing first,
/// as PyTorch does, so large sums do not overflow).
std::shared_ptr<CommHook> allreduce_hook();

/// Compress to float16 (divided by the world size first), all-reduce, decompress into
/// the bucket. Halves the bytes sent; gradients lose precision to fp16's 11-bit
/// significand and must stay within fp16's range after division.
std::shared_ptr<CommHook> fp16_compress_hook();

/// Compress to bfloat16 (divided by the world size first), all-reduce, decompress.
/// bf16 keeps float32's range with an 8-bit significand. Gloo in LibTorch 1.13 cannot
/// reduce bfloat16, so on "gloo" the bf16-rounded values travel as float32 and the sum
/// is rounded to bf16 again: the same numerics, without the bandwidth saving (use
/// fp16_compress_hook on Gloo to save bandwidth). Other backends reduce bf16 natively.
std::shared_ptr<CommHook> bf16_compress_hook();

}  // namespace comm_hooks
}  // namespace ddp
