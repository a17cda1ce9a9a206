#include "distributed/debug/traced_comm.h"

#include "distributed/common/check.h"
#include "distributed/debug/device_event.h"
#include "distributed/store_wait.h"

#include <ddp/errors.h>

#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include <cctype>
#include <sstream>

namespace ddp {
namespace detail {
namespace {

constexpr uint64_t kSlots = 4;

std::string op_name(ReduceOp op) { return ascii_lower(reduce_op_name(op)); }

std::string fp_key(int rank, uint64_t seq) {
  return "ddp/fp/" + std::to_string(rank) + "/" + std::to_string(seq % kSlots);
}

// "57 all_reduce(sum) [float 1024]" -> 57
uint64_t seq_of(const std::string& value) { return std::stoull(value.substr(0, value.find(' '))); }
std::string call_of(const std::string& value) { return value.substr(value.find(' ') + 1); }

// "all_reduce(sum) [float 1024]" at #57 -> "all_reduce(sum) #57 [float 1024]"
std::string at_seq(const std::string& call, uint64_t seq) {
  const size_t bracket = call.find(" [");
  if (bracket == std::string::npos) return call + " #" + std::to_string(seq);
  return call.substr(0, bracket) + " #" + std::to_string(seq) + call.substr(bracket);
}

// A work whose end goes into the recorder, and whose failure writes it out.
class TracedWork final : public PendingWork {
 public:
  TracedWork(std::shared_ptr<PendingWork> inner, std::shared_ptr<FlightRecorder> recorder,
             uint64_t seq, c10::Device device)
      : inner_(std::move(inner)), recorder_(std::move(recorder)), seq_(seq), device_(device) {
    if (!recorder_->enabled()) return;
    c10::intrusive_ptr<c10::ivalue::Future> future;
    try {
      future = inner_->future();
    } catch (const std::exception&) {
      return;  // a backend without futures: wait() records the end
    }
    std::weak_ptr<FlightRecorder> weak = recorder_;
    const uint64_t seq_copy = seq;
    const c10::Device on = device_;
    future->addCallback([weak, seq_copy, on](c10::ivalue::Future& f) {
      auto rec = weak.lock();
      if (!rec) return;
      if (f.hasError()) {
        rec->fail(seq_copy, f.tryRetrieveErrorMessage());
        rec->dump("collective #" + std::to_string(seq_copy) + " failed");
      } else {
        // Note [Device time]: the callback's stream waits for the collective.
        rec->complete_on_device(seq_copy, DeviceEvent::record(on));
      }
    });
  }

  void wait() override {
    try {
      inner_->wait();
    } catch (const std::exception& e) {
      recorder_->fail(seq_, e.what());
      recorder_->dump("collective #" + std::to_string(seq_) + " failed: " + e.what());
      throw;
    }
    // On a GPU the wait only made the current stream wait: an event there ends it.
    recorder_->complete_on_device(seq_, DeviceEvent::record(device_));
  }

  c10::intrusive_ptr<c10::ivalue::Future> future() override { return inner_->future(); }
  int source_rank() override { return inner_->source_rank(); }

 private:
  std::shared_ptr<PendingWork> inner_;
  std::shared_ptr<FlightRecorder> recorder_;
  uint64_t seq_;
  c10::Device device_;
};

// The device of a collective's tensors (the first defined one), for Note [Device time].
c10::Device device_of(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (t.defined()) return t.device();
  }
  return c10::Device(c10::DeviceType::CPU);
}

}  // namespace

std::string describe_tensors(const std::vector<at::Tensor>& tensors) {
  std::ostringstream os;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i > 0) os << ", ";
    const at::Tensor& t = tensors[i];
    if (!t.defined()) {
      os << "undefined";
      continue;
    }
    os << ascii_lower(c10::toString(t.scalar_type())) << " ";
    for (int64_t d = 0; d < t.dim(); ++d) os << (d > 0 ? "x" : "") << t.size(d);
    if (t.dim() == 0) os << "scalar";
  }
  return os.str();
}

TracedComm::TracedComm(std::unique_ptr<Comm> inner)
    : Comm(inner->config()),
      inner_(std::move(inner)),
      recorder_(std::make_shared<FlightRecorder>(config().flight_recorder_entries, config().rank,
                                                 config().world_size, config().backend,
                                                 config().flight_recorder_dir)) {}

template <typename Launch>
std::shared_ptr<PendingWork> TracedComm::traced(std::string what, c10::Device device,
                                                Launch&& launch) {
  std::lock_guard<std::mutex> lock(launch_mutex_);
  const uint64_t seq = ++seq_;
  if (config().debug_detail) check_fingerprint(seq, what);
  recorder_->start(seq, what);
  std::shared_ptr<PendingWork> work;
  try {
    work = launch();
  } catch (const std::exception& e) {
    recorder_->fail(seq, e.what());
    recorder_->dump("collective #" + std::to_string(seq) + " failed to start: " + e.what());
    throw;
  }
  return std::make_shared<TracedWork>(std::move(work), recorder_, seq, device);
}

std::shared_ptr<PendingWork> TracedComm::all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op) {
  return traced("all_reduce(" + op_name(op) + ") [" + describe_tensors(tensors) + "]",
                device_of(tensors), [&] { return inner_->all_reduce(tensors, op); });
}

std::shared_ptr<PendingWork> TracedComm::all_reduce_in_place(std::vector<at::Tensor>& tensors,
                                                             double scale) {
  return traced("all_reduce_in_place(sum) [" + describe_tensors(tensors) + "]", device_of(tensors),
                [&] { return inner_->all_reduce_in_place(tensors, scale); });
}

std::shared_ptr<PendingWork> TracedComm::broadcast(std::vector<at::Tensor>& tensors, int src) {
  return traced("broadcast [" + describe_tensors(tensors) + "] from rank " + std::to_string(src),
                device_of(tensors), [&] { return inner_->broadcast(tensors, src); });
}

std::shared_ptr<PendingWork> TracedComm::all_gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs) {
  return traced("all_gather [" + describe_tensors(inputs) + "]", device_of(inputs),
                [&] { return inner_->all_gather(outputs, inputs); });
}

std::shared_ptr<PendingWork> TracedComm::reduce_scatter_tensor(at::Tensor& output,
                                                               at::Tensor& input, ReduceOp op) {
  return traced("reduce_scatter_tensor(" + op_name(op) + ") [" + describe_tensors({input}) + "]",
                device_of({input}),
                [&] { return inner_->reduce_scatter_tensor(output, input, op); });
}

std::shared_ptr<PendingWork> TracedComm::reduce_scatter_tensor_scratch(at::Tensor& output,
                                                                       at::Tensor& input,
                                                                       ReduceOp op) {
  return traced("reduce_scatter_tensor(" + op_name(op) + ") [" + describe_tensors({input}) + "]",
                device_of({input}),
                [&] { return inner_->reduce_scatter_tensor_scratch(output, input, op); });
}

std::shared_ptr<PendingWork> TracedComm::all_gather_into_tensor(at::Tensor& output,
                                                                at::Tensor& input) {
  return traced("all_gather_into_tensor [" + describe_tensors({input}) + "]", device_of({input}),
                [&] { return inner_->all_gather_into_tensor(output, input); });
}

std::shared_ptr<PendingWork> TracedComm::reduce(std::vector<at::Tensor>& tensors, int dst,
                                                ReduceOp op) {
  return traced("reduce(" + op_name(op) + ") [" + describe_tensors(tensors) + "] to rank " +
                    std::to_string(dst),
                device_of(tensors), [&] { return inner_->reduce(tensors, dst, op); });
}

std::shared_ptr<PendingWork> TracedComm::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                std::vector<at::Tensor>& inputs, int dst) {
  return traced("gather [" + describe_tensors(inputs) + "] to rank " + std::to_string(dst),
                device_of(inputs), [&] { return inner_->gather(outputs, inputs, dst); });
}

std::shared_ptr<PendingWork> TracedComm::scatter(std::vector<at::Tensor>& outputs,
                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                 int src) {
  return traced("scatter [" + describe_tensors(outputs) + "] from rank " + std::to_string(src),
                device_of(outputs), [&] { return inner_->scatter(outputs, inputs, src); });
}

std::shared_ptr<PendingWork> TracedComm::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs, ReduceOp op) {
  return traced("reduce_scatter(" + op_name(op) + ") [" + describe_tensors(outputs) + "]",
                device_of(outputs), [&] { return inner_->reduce_scatter(outputs, inputs, op); });
}

// Shapes may differ from pair to pair: the fingerprint holds the dtype and the count.
std::shared_ptr<PendingWork> TracedComm::all_to_all(std::vector<at::Tensor>& outputs,
                                                    std::vector<at::Tensor>& inputs) {
  const std::string dtype = inputs.empty() || !inputs[0].defined()
                                ? std::string("undefined")
                                : ascii_lower(c10::toString(inputs[0].scalar_type()));
  return traced("all_to_all [" + dtype + " x" + std::to_string(inputs.size()) + "]",
                device_of(inputs), [&] { return inner_->all_to_all(outputs, inputs); });
}

// Split sizes may differ between ranks: the fingerprint holds the dtype and the shape of
// a row (ProcessGroup checks the splits pairwise in debug mode).
std::shared_ptr<PendingWork> TracedComm::all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& output_splits,
                                                           std::vector<int64_t>& input_splits) {
  std::ostringstream os;
  os << "all_to_all_single [" << ascii_lower(c10::toString(input.scalar_type())) << " rows of ";
  for (int64_t d = 1; d < input.dim(); ++d) os << (d > 1 ? "x" : "") << input.size(d);
  if (input.dim() <= 1) os << "scalar";
  os << "]";
  return traced(os.str(), device_of({input}), [&] {
    return inner_->all_to_all_single(output, input, output_splits, input_splits);
  });
}

template <typename Launch>
std::shared_ptr<PendingWork> TracedComm::traced_p2p(const std::string& what, Launch&& launch) {
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(launch_mutex_);
    seq = seq_;
  }
  const std::string label = what + " (after #" + std::to_string(seq) + ")";
  try {
    return launch();
  } catch (const std::exception& e) {
    recorder_->dump(label + " failed to start: " + e.what());
    throw;
  }
}

std::shared_ptr<PendingWork> TracedComm::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  return traced_p2p("send [" + describe_tensors(tensors) + "] to rank " + std::to_string(dst),
                    [&] { return inner_->send(tensors, dst, tag); });
}

std::shared_ptr<PendingWork> TracedComm::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  return traced_p2p("recv [" + describe_tensors(tensors) + "]",
                    [&] { return inner_->recv(tensors, src, tag); });
}

std::vector<std::shared_ptr<PendingWork>> TracedComm::batch_p2p(std::vector<P2P>& ops) {
  std::vector<std::shared_ptr<PendingWork>> works;
  traced_p2p("batch_isend_irecv of " + std::to_string(ops.size()) + " op(s)", [&] {
    works = inner_->batch_p2p(ops);
    return std::shared_ptr<PendingWork>();
  });
  return works;
}

// A barrier has no work to hand back: it is recorded around the blocking call.
namespace {
class BarrierWork final : public PendingWork {
 public:
  void wait() override {}
  c10::intrusive_ptr<c10::ivalue::Future> future() override {
    TORCH_INTERNAL_ASSERT(false, "a barrier has no future");
  }
};
}  // namespace

void TracedComm::barrier() {
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(launch_mutex_);
    seq = ++seq_;
    if (config().debug_detail) check_fingerprint(seq, "barrier");
    recorder_->start(seq, "barrier");
  }
  try {
    inner_->barrier();
  } catch (const std::exception& e) {
    recorder_->fail(seq, e.what());
    recorder_->dump("barrier #" + std::to_string(seq) + " failed: " + e.what());
    throw;
  }
  recorder_->complete(seq);
}

void TracedComm::shutdown() {
  recorder_->dump("shutdown");
  inner_->shutdown();
}

void TracedComm::check_fingerprint(uint64_t seq, const std::string& what) {
  const int world = config().world_size;
  const int rank = config().rank;
  inner_->store_set(fp_key(rank, seq), std::to_string(seq) + " " + what);

  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(fp_key(r, seq));
  // A slot still holding an older call is not this one yet.
  const TryGet current = [this, seq](const std::string& key) -> std::optional<std::string> {
    auto value = inner_->store_try_get(key);
    if (value && seq_of(*value) != seq) return std::nullopt;
    return value;
  };
  const std::string mine = at_seq(what, seq);
  const KeyWait got =
      wait_for_keys(current, keys, config().timeout, config().wait_report,
                    [&](const std::vector<size_t>& missing, std::chrono::seconds waited) {
                      std::vector<int> ranks(missing.begin(), missing.end());
                      return "[ddp] rank " + std::to_string(rank) + " is at " + mine +
                             " and has waited " + std::to_string(waited.count()) +
                             " s for rank(s) " + join_ranks(ranks) + " to reach it (timeout " +
                             std::to_string(config().timeout.count() / 1000) +
                             " s; DDP_DEBUG=detail)";
                    });

  if (!got.complete()) {
    std::ostringstream os;
    std::vector<int> ranks(got.missing.begin(), got.missing.end());
    os << "rank " << rank << " of " << world << " is at " << mine << " and waited "
       << config().timeout.count() << " ms for rank(s) " << join_ranks(ranks)
       << ", which never reached it:";
    for (int r : ranks) {
      // The latest call rank r did publish, from its slots.
      uint64_t best = 0;
      std::string call;
      for (uint64_t s = 0; s < kSlots; ++s) {
        auto v = inner_->store_try_get("ddp/fp/" + std::to_string(r) + "/" + std::to_string(s));
        if (v && seq_of(*v) > best) {
          best = seq_of(*v);
          call = call_of(*v);
        }
      }
      os << " rank " << r
         << (best == 0 ? std::string(" has not reached any collective")
                       : " is still at " + at_seq(call, best));
      os << ";";
    }
    os << " a rank that skipped a collective, or is stuck outside collectives, does this.";
    fail_check(seq, os.str(), /*timeout=*/true);
  }

  const std::string first = call_of(*got.values[0]);
  for (int r = 1; r < world; ++r) {
    const std::string call = call_of(*got.values[r]);
    if (call == first) continue;
    fail_check(seq,
               "collective mismatch: rank " + std::to_string(r) + " is at " + at_seq(call, seq) +
                   " while rank 0 is at " + at_seq(first, seq) + " (seen on rank " +
                   std::to_string(rank) + " of " + std::to_string(world) +
                   "; DDP_DEBUG=detail). Every rank must call "
                   "the same collectives, with the same dtypes and shapes, in the "
                   "same order.",
               /*timeout=*/false);
  }
}

void TracedComm::fail_check(uint64_t seq, const std::string& reason, bool timeout) {
  recorder_->start(seq, "fingerprint check");
  recorder_->fail(seq, reason);
  const std::string file = recorder_->dump(reason);
  const std::string text =
      reason + (file.empty() ? std::string() : " Flight recorder: " + file + ".");
  if (timeout) throw TimeoutError(text);
  throw MismatchError(text);
}

}  // namespace detail
}  // namespace ddp
