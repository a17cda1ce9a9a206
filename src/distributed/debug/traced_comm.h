#pragma once

// A Comm that numbers, records and (in debug mode) cross-checks every collective of the
// Comm it wraps. See Note [Flight recorder] and Note [Collective fingerprints].

#include "distributed/comm.h"
#include "distributed/debug/flight_recorder.h"

#include <memory>
#include <mutex>

namespace ddp {
namespace detail {

/// Note [Collective fingerprints]
/// With DDP_DEBUG=detail (or InitOptions::debug("detail")), before each collective every
/// rank publishes "<seq> <op> [<dtype> <shape>, ...]" under ddp/fp/<rank>/<seq % 4> in
/// the rendezvous store and reads every other rank's entry for the same sequence
/// number. That covers ddp-cpp's own collectives and DDP's buckets alike, since all go
/// through the group. A difference raises MismatchError on every rank, naming the
/// lowest rank whose call differs from rank 0's and both calls. A rank that does not
/// publish in time is named, with the last call it did publish, in a TimeoutError. A
/// rank publishes #s+4 only after reading everyone's #s+1..#s+3, so four slots per rank
/// are never overwritten while a peer still needs them. The store round trips make this
/// mode slow. When it is off, nothing is published.
class TracedComm final : public Comm {
 public:
  explicit TracedComm(std::unique_ptr<Comm> inner);

  c10::Device device() const override { return inner_->device(); }
  bool trivial() const override { return inner_->trivial(); }
  bool reduces_dtype(c10::ScalarType dtype) const override { return inner_->reduces_dtype(dtype); }
  at::Tensor to_device(const at::Tensor& t) override { return inner_->to_device(t); }
  at::Tensor to_host(const at::Tensor& t) override { return inner_->to_host(t); }

  std::shared_ptr<PendingWork> all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op) override;
  std::shared_ptr<PendingWork> broadcast(std::vector<at::Tensor>& tensors, int src) override;
  std::shared_ptr<PendingWork> all_gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs) override;
  std::shared_ptr<PendingWork> reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                     ReduceOp op) override;
  std::shared_ptr<PendingWork> reduce_scatter_tensor_scratch(at::Tensor& output, at::Tensor& input,
                                                             ReduceOp op) override;
  std::shared_ptr<PendingWork> all_gather_into_tensor(at::Tensor& output,
                                                      at::Tensor& input) override;
  // The rest of torch.distributed's collectives: numbered, recorded and fingerprinted as
  // the ones above. Point to point involves two ranks, not the group: it is neither
  // numbered nor fingerprinted (the group's sequence stays the same on every rank), and
  // a failure to start is written out after the number of the collective before it.
  std::shared_ptr<PendingWork> reduce(std::vector<at::Tensor>& tensors, int dst,
                                      ReduceOp op) override;
  std::shared_ptr<PendingWork> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                      std::vector<at::Tensor>& inputs, int dst) override;
  std::shared_ptr<PendingWork> scatter(std::vector<at::Tensor>& outputs,
                                       std::vector<std::vector<at::Tensor>>& inputs,
                                       int src) override;
  std::shared_ptr<PendingWork> reduce_scatter(std::vector<at::Tensor>& outputs,
                                              std::vector<std::vector<at::Tensor>>& inputs,
                                              ReduceOp op) override;
  std::shared_ptr<PendingWork> all_to_all(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs) override;
  std::shared_ptr<PendingWork> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_splits,
                                                 std::vector<int64_t>& input_splits) override;
  std::shared_ptr<PendingWork> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  std::shared_ptr<PendingWork> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  std::vector<std::shared_ptr<PendingWork>> batch_p2p(std::vector<P2P>& ops) override;
  bool reduces_op(ReduceOp op) const override { return inner_->reduces_op(op); }
  void barrier() override;
  bool reduces_in_place(c10::ScalarType dtype, size_t num_tensors) const override {
    return inner_->reduces_in_place(dtype, num_tensors);
  }
  std::shared_ptr<PendingWork> all_reduce_in_place(std::vector<at::Tensor>& tensors,
                                                   double scale) override;
  std::vector<at::Tensor> allocate_buffers(const std::vector<int64_t>& numels,
                                           const std::vector<at::TensorOptions>& options) override {
    return inner_->allocate_buffers(numels, options);
  }

  void store_set(const std::string& key, const std::string& value) override {
    inner_->store_set(key, value);
  }
  std::optional<std::string> store_try_get(const std::string& key) override {
    return inner_->store_try_get(key);
  }
  /// Writes the flight recorder (if a folder is set and nothing failed earlier: a rank
  /// that ends normally still shows its peers' failure what it did), then releases.
  void shutdown() override;

 private:
  template <typename Launch>
  std::shared_ptr<PendingWork> traced(std::string what, c10::Device device, Launch&& launch);
  template <typename Launch>
  std::shared_ptr<PendingWork> traced_p2p(const std::string& what, Launch&& launch);
  void check_fingerprint(uint64_t seq, const std::string& what);
  [[noreturn]] void fail_check(uint64_t seq, const std::string& reason, bool timeout);

  std::unique_ptr<Comm> inner_;
  std::shared_ptr<FlightRecorder> recorder_;
  std::mutex launch_mutex_;  // sequence numbers follow launch order
  uint64_t seq_ = 0;
};

/// "float 4x256", "long 3", for fingerprints and records.
std::string describe_tensors(const std::vector<at::Tensor>& tensors);

}  // namespace detail
}  // namespace ddp
