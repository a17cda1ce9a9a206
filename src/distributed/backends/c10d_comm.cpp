// Every c10d call of ddp-cpp is in this file (and c10d::Work's, in work.cpp).
//
// Note [LibTorch versions]
// In 1.13, ProcessGroupGloo and ProcessGroupNCCL derive from c10d::ProcessGroup; in 2.x
// they derive from c10d::Backend and ProcessGroup became a dispatching wrapper. Both
// keep the same constructor (store, rank, size, options) and the same collective
// signatures on the concrete classes, and both have c10d::Work with wait() and
// getFuture(). Holding the concrete class (C10dComm<PG>) therefore compiles against
// either, with no #if on the version. Stores are the same in both.
//
// Note [Gloo headers]
// ProcessGroupGloo.hpp includes Gloo's headers. Debian's LibTorch comes with matching
// ones (libgloo-dev). pip torch links its own Gloo statically and ships no Gloo headers,
// and no package reachable from Debian or PyPI has the ones it was built with, so its
// build compiles against libgloo-dev's (May 2022) as well. That is sound because this
// file, the only one that includes them, uses Gloo types only as opaque handles:
// createDeviceFor*() returns a std::shared_ptr<gloo::transport::Device> made inside
// libtorch, which is stored in Options::devices and handed back to libtorch. No Gloo
// object is constructed, destroyed, laid out or called here, so a difference between
// the two Gloo versions (2.x's GlooStore has store-v2 methods that 2022 Gloo lacks)
// cannot reach compiled code of ours. What must match, and does, is the c10d side:
// the class layouts and signatures come from pip torch's own headers.

#include "distributed/backends/c10d_comm.h"

#include "distributed/common/check.h"
#include "distributed/rendezvous/signed_records.h"
#include "secret/job_secret.h"

#include <ddp/errors.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>
#ifdef DDP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <dlfcn.h>
#include <nccl.h>
#endif
#ifdef DDP_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <csignal>
#include <mutex>
#include <set>
#include <thread>

#include <signal.h>
#include <unistd.h>

namespace ddp {
namespace detail {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
      return c10d::ReduceOp::SUM;
    case ReduceOp::MAX:
      return c10d::ReduceOp::MAX;
    case ReduceOp::MIN:
      return c10d::ReduceOp::MIN;
    case ReduceOp::PRODUCT:
      return c10d::ReduceOp::PRODUCT;
    case ReduceOp::BAND:
      return c10d::ReduceOp::BAND;
    case ReduceOp::BOR:
      return c10d::ReduceOp::BOR;
    case ReduceOp::BXOR:
      return c10d::ReduceOp::BXOR;
    case ReduceOp::PREMUL_SUM:
#ifdef DDP_WITH_NCCL
      // Only NCCL takes it (C10dComm::reduces_op); the factor travels with the op.
      {
        // c10d's makePreMulSum, spelled out: its name changed between LibTorch versions.
        c10d::ReduceOp rop;
        rop.op_ = c10d::ReduceOp::PREMUL_SUM;
        rop.supplement_ = c10::make_intrusive<c10d::NCCLPreMulSumSupplement>(op.factor());
        return rop;
      }
#else
      break;
#endif
    case ReduceOp::AVG:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "ReduceOp ", reduce_op_name(op),
                        " must be lowered or refused before reaching c10d");
}

void store_set_on(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::optional<std::string> store_try_get_on(c10d::Store& store, const std::string& key) {
  if (!store.check({key})) return std::nullopt;
  const std::vector<uint8_t> bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
}

// Note [Signed store records] (signed_records.cpp): the store of a job with a secret, under
// every group's records, Gloo's and NCCL's own included. Values are sealed on the way in
// and checked on the way out; counters, existence and deletion pass through as they are.
class SignedStore final : public c10d::Store {
 public:
  SignedStore(c10::intrusive_ptr<c10d::Store> inner, std::shared_ptr<const RecordSigner> signer,
              int rank)
      : c10d::Store(inner->getTimeout()),
        inner_(std::move(inner)),
        signer_(std::move(signer)),
        rank_(rank) {}

#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<SignedStore>(inner_->clone(), signer_, rank_);
  }
  // Appending cannot be signed (the server concatenates); multiGet and multiSet go key by
  // key, through get and set.
  bool hasExtendedApi() const override { return false; }
  void append(const std::string& key, const std::vector<uint8_t>&) override {
    throw std::runtime_error("rank " + std::to_string(rank_) + ": the store of a job with a " +
                             "secret (DDP_SECRET_FILE) cannot append to '" + key +
                             "': appended bytes cannot be signed. Use set().");
  }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    std::vector<std::vector<uint8_t>> values;
    for (const std::string& key : keys) values.push_back(get(key));
    return values;
  }
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override {
    for (size_t i = 0; i < keys.size() && i < values.size(); ++i) set(keys[i], values[i]);
  }
#endif

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    inner_->set(key, seal(key, value));
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& current,
                                  const std::vector<uint8_t>& desired) override {
    const std::vector<uint8_t> sealed = seal(key, desired);
    const std::vector<uint8_t> got =
        inner_->compareSet(key, current.empty() ? current : seal(key, current), sealed);
    if (got == sealed) return desired;
    if (auto value = signer_->open(key, text(got))) return bytes(*value);
    throw std::runtime_error(refusal(key, "compare-and-set found it"));
  }
  // Waits for the key as the store does, then, while its record does not verify, for a
  // signed one to replace it: within the store's timeout from the start.
  std::vector<uint8_t> get(const std::string& key) override {
    const auto start = std::chrono::steady_clock::now();
    std::vector<uint8_t> record = inner_->get(key);
    std::chrono::milliseconds pause(2);
    for (;;) {
      if (auto value = signer_->open(key, text(record))) return bytes(*value);
      say_refused(key);
      if (std::chrono::steady_clock::now() - start >= inner_->getTimeout()) {
        throw std::runtime_error(refusal(key, "waited " +
                                                  std::to_string(inner_->getTimeout().count()) +
                                                  " ms (the store's timeout) for a signed one"));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(100));
      record = inner_->get(key);
    }
  }
  /// The key's value if it is there and verifies; nullopt otherwise (a record that does
  /// not verify is reported once). Never blocks.
  std::optional<std::string> try_get(const std::string& key) {
    if (!inner_->check({key})) return std::nullopt;
    if (auto value = signer_->open(key, text(inner_->get(key)))) return value;
    say_refused(key);
    return std::nullopt;
  }

  bool refused(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    return refused_.count(key) > 0;
  }

  int64_t add(const std::string& key, int64_t value) override { return inner_->add(key, value); }
  bool deleteKey(const std::string& key) override { return inner_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  int64_t getNumKeys() override { return inner_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { inner_->wait(keys); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_->wait(keys, timeout);
  }
  const std::chrono::milliseconds& getTimeout() const noexcept override {
    return inner_->getTimeout();
  }
  void setTimeout(const std::chrono::milliseconds& timeout) override {
    inner_->setTimeout(timeout);
  }

 private:
  static std::string text(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }
  static std::vector<uint8_t> bytes(const std::string& s) {
    return std::vector<uint8_t>(s.begin(), s.end());
  }
  std::vector<uint8_t> seal(const std::string& key, const std::vector<uint8_t>& value) const {
    return bytes(signer_->seal(key, text(value)));
  }
  std::string refusal(const std::string& key, const std::string& then) const {
    return "rank " + std::to_string(rank_) + " refused the store's record '" +
           secret::printable(key, 120) + "': its signature does not match this job's secret; " +
           then + ". Either a process without the secret wrote it (anyone who reaches the " +
           "store's port can: docs/security.md, which says how to keep strangers out), or the " +
           "ranks were given different secrets: give every host the same DDP_SECRET_FILE " +
           "(ddprun --rdzv-secret-file).";
  }
  void say_refused(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!refused_.insert(key).second) return;
    std::fprintf(stderr, "[ddp] %s\n",
                 refusal(key, "waiting for a signed record to replace it").c_str());
  }

  c10::intrusive_ptr<c10d::Store> inner_;
  std::shared_ptr<const RecordSigner> signer_;
  int rank_;
  std::mutex mutex_;
  std::set<std::string> refused_;
};

// The library's Store over a c10d store. With a secret, `signed_` is the SignedStore at
// the bottom of `store_` and `prefix_` the prefixes above it (PrefixStore's "a/b"), so
// that try_get can check a record without blocking.
class C10dStore final : public Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store,
                     c10::intrusive_ptr<SignedStore> signed_store = {}, std::string prefix = {})
      : store_(std::move(store)), signed_(std::move(signed_store)), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::string& value) override {
    store_set_on(*store_, key, value);
  }
  std::optional<std::string> try_get(const std::string& key) override {
    if (signed_) return signed_->try_get(full_name(key));
    return store_try_get_on(*store_, key);
  }
  bool refused(const std::string& key) override {
    return signed_ && signed_->refused(full_name(key));
  }
  std::shared_ptr<Store> prefixed(const std::string& prefix) override {
    return std::make_shared<C10dStore>(c10::make_intrusive<c10d::PrefixStore>(prefix, store_),
                                       signed_, full_name(prefix));
  }
  const c10::intrusive_ptr<c10d::Store>& get() const { return store_; }

 private:
  // `key`'s name in the store below every prefix, as PrefixStore joins them.
  std::string full_name(const std::string& key) const {
    return prefix_.empty() ? key : prefix_ + "/" + key;
  }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<SignedStore> signed_;
  std::string prefix_;
};

const c10::intrusive_ptr<c10d::Store>& c10d_store(const std::shared_ptr<Store>& store) {
  return static_cast<const C10dStore&>(*store).get();
}

// Note [NCCL shutdown]. Gloo's works complete on the host: nothing to do first.
template <typename PG>
bool finish_backend(PG&, const std::vector<c10::intrusive_ptr<c10d::Work>>&,
                    std::chrono::milliseconds) {
  return false;
}

#ifdef DDP_WITH_NCCL
bool finish_backend(c10d::ProcessGroupNCCL& pg,
                    const std::vector<c10::intrusive_ptr<c10d::Work>>& works,
                    std::chrono::milliseconds timeout) {
  bool clean = true;
  for (const auto& work : works) {
    try {
      work->wait(timeout);  // with a timeout: a host wait for the kernel
    } catch (const std::exception&) {
      clean = false;
    }
  }
  try {
    if (clean) {
      pg.shutdown();
    } else {
      pg.abort();
    }
  } catch (const std::exception&) {
    pg.abort();
  }
  return true;
}
#endif

// batch_isend_irecv. Gloo's sends and receives return at once, so launching them one by
// one never deadlocks, whatever the two sides' orders.
template <typename PG, typename Launch>
std::vector<c10::intrusive_ptr<c10d::Work>> launch_batch(PG&, size_t n, Launch&& launch) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < n; ++i) works.push_back(launch(i));
  return works;
}

#ifdef DDP_WITH_NCCL
// NCCL's would: a send blocks its stream until the peer's receive runs. As
// torch.distributed.batch_isend_irecv does, the ops are one group (coalesced), and every
// op's work is the group's.
template <typename Launch>
std::vector<c10::intrusive_ptr<c10d::Work>> launch_batch(c10d::ProcessGroupNCCL& pg, size_t n,
                                                         Launch&& launch) {
  pg.startCoalescing();
  try {
    for (size_t i = 0; i < n; ++i) launch(i);
  } catch (...) {
    pg.endCoalescing();
    throw;
  }
  c10::intrusive_ptr<c10d::Work> group = pg.endCoalescing();
  return std::vector<c10::intrusive_ptr<c10d::Work>>(n, group);
}
#endif

template <typename PG>
class C10dComm final : public Comm {
 public:
  C10dComm(CommConfig config, c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<PG> pg)
      : Comm(std::move(config)), store_(std::move(store)), pg_(std::move(pg)) {}

  ~C10dComm() override { shutdown(); }

  std::shared_ptr<PendingWork> all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op) override {
    check_devices("all_reduce", tensors);
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.timeout = config_->timeout;
    return run("all_reduce", [&] { return pg()->allreduce(tensors, opts); });
  }

  std::shared_ptr<PendingWork> broadcast(std::vector<at::Tensor>& tensors, int src) override {
    check_devices("broadcast", tensors);
    c10d::BroadcastOptions opts;
    opts.rootRank = src;
    opts.timeout = config_->timeout;
    return run("broadcast", [&] { return pg()->broadcast(tensors, opts); });
  }

  std::shared_ptr<PendingWork> all_gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs) override {
    check_devices("all_gather", inputs);
    for (const auto& out : outputs) check_devices("all_gather (outputs)", out);
    c10d::AllgatherOptions opts;
    opts.timeout = config_->timeout;
    return run("all_gather", [&] { return pg()->allgather(outputs, inputs, opts); });
  }

  // Note [Native flat collectives]: _reduce_scatter_base and _allgather_base are
  // declared in both LibTorch versions (2.x forwards them to reduce_scatter_single and
  // all_gather_single), but Gloo in 1.13 refuses them when called. The refusal comes at
  // launch, before any byte is sent, so the first one switches this group to the
  // fallbacks of Note [Flat collective fallbacks] for good; every rank refuses alike.
  std::shared_ptr<PendingWork> reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                     ReduceOp op) override {
    return reduce_scatter(output, input, op, /*scratch=*/false);
  }
  std::shared_ptr<PendingWork> reduce_scatter_tensor_scratch(at::Tensor& output, at::Tensor& input,
                                                             ReduceOp op) override {
    return reduce_scatter(output, input, op, /*scratch=*/true);
  }
  std::shared_ptr<PendingWork> reduce_scatter(at::Tensor& output, at::Tensor& input, ReduceOp op,
                                              bool scratch) {
    check_flat("reduce_scatter_tensor", input, output);
    if (native_reduce_scatter_) {
      c10d::ReduceScatterOptions opts;
      opts.reduceOp = to_c10d(op);
      opts.timeout = config_->timeout;
      if (auto work = run_native("reduce_scatter_tensor", native_reduce_scatter_,
                                 [&] { return pg()->_reduce_scatter_base(output, input, opts); })) {
        return flat_work(std::move(work), output);
      }
    }
    return reduce_scatter_by_all_reduce(output, input, op, scratch);
  }

  std::shared_ptr<PendingWork> all_gather_into_tensor(at::Tensor& output,
                                                      at::Tensor& input) override {
    check_flat("all_gather_into_tensor", output, input);
    if (native_all_gather_) {
      c10d::AllgatherOptions opts;
      opts.timeout = config_->timeout;
      if (auto work = run_native("all_gather_into_tensor", native_all_gather_,
                                 [&] { return pg()->_allgather_base(output, input, opts); })) {
        return flat_work(std::move(work), output);
      }
    }
    return all_gather_by_views(output, input);
  }

  // ---- The rest of torch.distributed's collectives ----------------------------------
  // Empty tensors never reach the backend (Gloo in 1.13 divides by the element count in
  // some collectives); the caller has checked that every rank's are alike.

  std::shared_ptr<PendingWork> reduce(std::vector<at::Tensor>& tensors, int dst,
                                      ReduceOp op) override {
    check_devices("reduce", tensors);
    if (tensors[0].numel() == 0) return done_work(tensors);
    c10d::ReduceOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.rootRank = dst;
    opts.timeout = config_->timeout;
    // Gloo reduces in every rank's buffer; the other ranks' tensors are kept as they were
    // (docs/process_groups.md), so they lend it a copy. NCCL writes only the root's.
    if (config_->rank != dst && config_->backend != "nccl") {
      std::vector<at::Tensor> scratch{tensors[0].clone()};
      return then_work(run("reduce", [&] { return pg()->reduce(scratch, opts); }), nullptr,
                       tensors);
    }
    return run("reduce", [&] { return pg()->reduce(tensors, opts); });
  }

  std::shared_ptr<PendingWork> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                      std::vector<at::Tensor>& inputs, int dst) override {
    check_devices("gather", inputs);
    for (const auto& out : outputs) check_devices("gather (outputs)", out);
    if (inputs[0].numel() == 0) return done_work(outputs.empty() ? inputs : outputs[0]);
    c10d::GatherOptions opts;
    opts.rootRank = dst;
    opts.timeout = config_->timeout;
    return run("gather", [&] { return pg()->gather(outputs, inputs, opts); });
  }

  std::shared_ptr<PendingWork> scatter(std::vector<at::Tensor>& outputs,
                                       std::vector<std::vector<at::Tensor>>& inputs,
                                       int src) override {
    check_devices("scatter", outputs);
    for (const auto& in : inputs) check_devices("scatter (inputs)", in);
    if (outputs[0].numel() == 0) return done_work(outputs);
    c10d::ScatterOptions opts;
    opts.rootRank = src;
    opts.timeout = config_->timeout;
    return run("scatter", [&] { return pg()->scatter(outputs, inputs, opts); });
  }

  // Gloo: Note [Collective fallbacks] (none in 1.13; 2.x's keeps its buffers).
  std::shared_ptr<PendingWork> reduce_scatter(std::vector<at::Tensor>& outputs,
                                              std::vector<std::vector<at::Tensor>>& inputs,
                                              ReduceOp op) override {
    if (config_->backend != "nccl" || outputs[0].numel() == 0) {
      return reduce_scatter_by_flat(outputs, inputs, op);
    }
    check_devices("reduce_scatter", inputs[0]);
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.timeout = config_->timeout;
    return run("reduce_scatter", [&] { return pg()->reduce_scatter(outputs, inputs, opts); });
  }

  // NCCL's list all_to_all takes a size per pair. Gloo's has none in 1.13, and in 2.x
  // wants every tensor of one size: Gloo always goes through all_to_all_single (Note
  // [Collective fallbacks]).
  std::shared_ptr<PendingWork> all_to_all(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs) override {
    check_devices("all_to_all", inputs);
    check_devices("all_to_all (outputs)", outputs);
    if (config_->backend == "nccl") {
      c10d::AllToAllOptions opts;
      opts.timeout = config_->timeout;
      return run("all_to_all", [&] { return pg()->alltoall(outputs, inputs, opts); });
    }
    return all_to_all_by_single(outputs, inputs);
  }

  std::shared_ptr<PendingWork> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_splits,
                                                 std::vector<int64_t>& input_splits) override {
    check_devices("all_to_all_single", {input, output});
    if (input.numel() == 0 && output.numel() == 0) return done_work({output});
    c10d::AllToAllOptions opts;
    opts.timeout = config_->timeout;
    return run("all_to_all_single", [&] {
      return pg()->alltoall_base(output, input, output_splits, input_splits, opts);
    });
  }

  std::shared_ptr<PendingWork> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    check_devices("send", tensors);
    return run("send", [&] { return pg()->send(tensors, dst, tag); });
  }

  std::shared_ptr<PendingWork> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    check_devices("recv", tensors);
    if (src == kAnySource) {
      return run("recv (from any source)", [&] { return pg()->recvAnysource(tensors, tag); });
    }
    return run("recv", [&] { return pg()->recv(tensors, src, tag); });
  }

  std::vector<std::shared_ptr<PendingWork>> batch_p2p(std::vector<P2P>& ops) override {
    for (const P2P& op : ops) check_devices("batch_isend_irecv", {op.tensor});
    std::vector<std::vector<at::Tensor>> lists;
    for (const P2P& op : ops) lists.push_back({op.tensor});
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    try {
      works = launch_batch(*pg(), ops.size(), [&](size_t i) {
        return ops[i].send ? pg()->send(lists[i], ops[i].peer, ops[i].tag)
                           : pg()->recv(lists[i], ops[i].peer, ops[i].tag);
      });
    } catch (const std::exception& e) {
      rethrow_comm_error(e, *config_, "batch_isend_irecv");
    }
    std::vector<std::shared_ptr<PendingWork>> out;
    for (size_t i = 0; i < works.size(); ++i) {
      track(works[i]);
      out.push_back(c10d_work(works[i], config_, ops[i].send ? "isend" : "irecv"));
    }
    return out;
  }

  bool reduces_op(ReduceOp op) const override {
    return op != ReduceOp::PREMUL_SUM || config_->backend == "nccl";
  }

  void barrier() override {
    c10d::BarrierOptions opts;
    opts.timeout = config_->timeout;
    // Without device_ids, ProcessGroupNCCL guesses the GPU as rank % device count,
    // which is not this rank's when processes per host differ from GPUs per host.
    if (config_->backend == "nccl") opts.device_ids = {config_->local_rank};
    run("barrier", [&] { return pg()->barrier(opts); })->wait();
  }

  void store_set(const std::string& key, const std::string& value) override {
    store_set_on(*store(), key, value);
  }
  std::optional<std::string> store_try_get(const std::string& key) override {
    return store_try_get_on(*store(), key);
  }

  // Note [Gloo and bfloat16]: Gloo in LibTorch 1.13 has no bfloat16 all-reduce.
  bool reduces_dtype(c10::ScalarType dtype) const override {
    return config_->backend == "nccl" || dtype != at::kBFloat16;
  }

  void shutdown() override {
    // Dropping the last reference joins the backend's worker threads and closes its
    // sockets; the store goes after the group that uses it. A worker still inside a
    // collective that a peer never joined would hold that join until the timeout, so
    // then the group is left to the process exit instead (see Comm::shutdown).
    // Note [NCCL shutdown]: a work of NCCL is complete only when its kernel is, which
    // may be after the host returned from the step that launched it; so NCCL first
    // waits for its works on the host, then closes its communicators (abort, when a
    // work failed or timed out), and the group is then released like any other.
    if (pg_ && finish_backend(*pg_, take_in_flight(), config_->timeout)) {
      pg_.reset();
      store_.reset();
      return;
    }
    if (pg_ && any_in_flight()) {
      pg_.release();     // deliberately leaked: its threads are still blocked
      store_.release();  // used by the leaked group
      return;
    }
    pg_.reset();
    store_.reset();
  }

 private:
  PG* pg() {
    DDP_CHECK(pg_, "process group of ", where(*config_), " was already shut down");
    return pg_.get();
  }
  c10d::Store* store() {
    DDP_CHECK(store_, "process group of ", where(*config_), " was already shut down");
    return store_.get();
  }

  template <typename F>
  std::shared_ptr<PendingWork> run(const char* what, F&& launch) {
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = launch();
    } catch (const std::exception& e) {
      rethrow_comm_error(e, *config_, what);
    }
    track(work);
    return c10d_work(std::move(work), config_, what);
  }

  // run() for an op the backend may not have: nullptr (and `native` cleared) when it
  // refuses the call (Note [Native flat collectives]).
  template <typename F>
  std::shared_ptr<PendingWork> run_native(const char* what, std::atomic<bool>& native, F&& launch) {
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = launch();
    } catch (const std::exception& e) {
      if (!is_unsupported_op(cause_text(e))) rethrow_comm_error(e, *config_, what);
      native = false;
      return nullptr;
    }
    track(work);
    return c10d_work(std::move(work), config_, what);
  }

  // Works launched and not yet seen complete, for shutdown(). Completed ones are
  // dropped on each launch, so the list stays as short as what is in flight.
  void track(const c10::intrusive_ptr<c10d::Work>& work) {
    std::lock_guard<std::mutex> lock(in_flight_mutex_);
    in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                    [](const auto& w) { return w->isCompleted(); }),
                     in_flight_.end());
    in_flight_.push_back(work);
  }

  std::vector<c10::intrusive_ptr<c10d::Work>> take_in_flight() {
    std::lock_guard<std::mutex> lock(in_flight_mutex_);
    return in_flight_;
  }

  bool any_in_flight() {
    std::lock_guard<std::mutex> lock(in_flight_mutex_);
    return std::any_of(in_flight_.begin(), in_flight_.end(),
                       [](const auto& w) { return !w->isCompleted(); });
  }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<PG> pg_;
  std::mutex in_flight_mutex_;
  std::vector<c10::intrusive_ptr<c10d::Work>> in_flight_;
  // Note [Gloo's reduce-scatter keeps its output]: ProcessGroupGloo's reduce_scatter
  // (LibTorch 2.x's reduce_scatter_single) never releases what it was given: measured
  // with LibTorch 2.15, every call left its output and a buffer of the input's size
  // allocated for good (a fully_shard step of 6 units of 33.6 MB gained 201 MB, every
  // step; Python's dist.reduce_scatter_tensor on Gloo grows by its output's size per
  // call too). So Gloo reduce-scatters by all-reduce (Note [Flat collective fallbacks]),
  // in place where the caller's input is scratch: twice the bytes of a native
  // reduce-scatter on the wire, nothing kept.
  std::atomic<bool> native_reduce_scatter_{config_->backend != "gloo"};
  std::atomic<bool> native_all_gather_{true};
};

// c10's own log threshold, raised to FATAL for a scope. LibTorch builds with glog
// (Debian's) log through glog, whose threshold is not ours to change: there it is a no-op.
class QuietC10Logging {
 public:
#ifndef C10_USE_GLOG
  QuietC10Logging() : saved_(FLAGS_caffe2_log_level) { FLAGS_caffe2_log_level = 3; }
  ~QuietC10Logging() { FLAGS_caffe2_log_level = saved_; }

 private:
  int saved_;
#endif
};

c10::intrusive_ptr<c10d::Store> make_store(const CommConfig& c) {
  switch (c.store) {
    case CommConfig::StoreKind::kFile: {
      auto store = c10::make_intrusive<c10d::FileStore>(c.store_path, c.world_size);
      store->setTimeout(c.timeout);
      return store;
    }
    case CommConfig::StoreKind::kTcp: {
      c10d::TCPStoreOptions opts;
      opts.port = static_cast<std::uint16_t>(c.master_port);
      opts.isServer = c.rank == 0;
      opts.numWorkers = static_cast<std::size_t>(c.world_size);
      opts.waitWorkers = false;  // the backend's own rendezvous waits for everyone
      opts.timeout = c.timeout;
      if (c.master_listen_fd >= 0) {  // Note [Handed-over port] in rendezvous.cpp
#if TORCH_VERSION_MAJOR >= 2
        opts.masterListenFd = c.master_listen_fd;
#else
        ::close(c.master_listen_fd);
#endif
      }
      // A client that cannot reach the master gets one clear error from us; c10d's own
      // log lines about each failed attempt would only repeat it.
      [[maybe_unused]] QuietC10Logging quiet;  // empty with glog
      return c10::make_intrusive<c10d::TCPStore>(c.master_addr, opts);
    }
    case CommConfig::StoreKind::kNone:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "no store configured for world size ", c.world_size);
}

// Note [SIGPIPE]
// Gloo writes to its sockets with writev, which raises SIGPIPE when the peer has gone
// (killed, or its group released while ours still had a collective in flight). The
// default action of SIGPIPE kills the process, so a dead peer would take this rank down
// silently instead of failing the collective with an error that names it. Python, and
// with it PyTorch, ignores SIGPIPE; a C++ program does not. So a Gloo group sets
// SIGPIPE to ignored while it is still at its default; a handler the program installed
// itself is left alone.
void ignore_sigpipe_if_default() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
}

std::unique_ptr<Comm> make_gloo(const CommConfig& c, const c10::intrusive_ptr<c10d::Store>& store) {
  ignore_sigpipe_if_default();
  auto opts = c10d::ProcessGroupGloo::Options::create(c.timeout);
  if (!c.gloo_interface.empty()) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(c.gloo_interface));
  } else if (!c.gloo_address.empty()) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(c.gloo_address));
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, c.rank, c.world_size, opts);
  return std::make_unique<C10dComm<c10d::ProcessGroupGloo>>(c, store, std::move(pg));
}

#ifdef DDP_WITH_NCCL
// The version of the libnccl.so.2 loaded in this process (libtorch_cuda's), or 0 when
// none is. Looked up at run time: ddp-cpp does not link NCCL itself.
int loaded_nccl_version() {
  using GetVersion = int (*)(int*);
  auto get = reinterpret_cast<GetVersion>(dlsym(RTLD_DEFAULT, "ncclGetVersion"));
  int version = 0;
  return get != nullptr && get(&version) == 0 ? version : 0;
}

std::string nccl_version_string(int code) {
  // Codes are major*10000 + minor*100 + patch from NCCL 2.9 on (major*1000 + ... before).
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  const int patch = code % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::unique_ptr<Comm> make_nccl(const CommConfig& c, const c10::intrusive_ptr<c10d::Store>& store) {
  check_nccl_runtime(c.rank);
  // Lesson step 4: one process, one GPU, chosen by local rank.
  const int devices = c10::cuda::device_count();
  DDP_CHECK(c.local_rank < devices, "backend \"nccl\": rank ", c.rank, " has local rank ",
            c.local_rank, " but only ", devices, " CUDA device(s) are visible. Start at most ",
            devices, " processes per host (ddprun --nproc-per-node gpu), or use \"gloo\".");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(c.local_rank));
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = c.timeout;
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, c.rank, c.world_size, opts);
  return std::make_unique<C10dComm<c10d::ProcessGroupNCCL>>(c, store, std::move(pg));
}
#endif

}  // namespace

std::shared_ptr<Store> open_store(const CommConfig& c) {
  c10::intrusive_ptr<c10d::Store> store;
  try {
    // A one-rank group meets nobody: a store in this process serves it.
    if (c.world_size == 1 && c.store == CommConfig::StoreKind::kNone) {
      store = c10::make_intrusive<c10d::HashStore>();
    } else {
      store = make_store(c);
    }
  } catch (const std::exception& e) {
    const std::string text = cause_text(e);
    const std::string t = ascii_lower(text);
    if (t.find("address already in use") != std::string::npos) {
      throw ProcessGroupError("rank 0 could not listen on port " + std::to_string(c.master_port) +
                              " of " + c.master_addr +
                              ": the port is already in use. Choose a free MASTER_PORT (or "
                              "let ddprun pick one with --master-port 0). Cause: " +
                              text);
    }
    if (classify_comm_failure(text) == CommFailure::kTimeout ||
        t.find("connect") != std::string::npos) {
      throw TimeoutError("rank " + std::to_string(c.rank) + " could not reach the master at " +
                         c.master_addr + ":" + std::to_string(c.master_port) + " within " +
                         std::to_string(c.timeout.count()) +
                         " ms: no answer. Check MASTER_ADDR and MASTER_PORT, that rank 0 "
                         "is running, and that the port is reachable. Cause: " +
                         text);
    }
    throw ProcessGroupError("rank " + std::to_string(c.rank) + " could not open " +
                            store_description(c) + ". Cause: " + text);
  }

  if (c.record_signer && c.store != CommConfig::StoreKind::kNone) {
    auto signed_store = c10::make_intrusive<SignedStore>(std::move(store), c.record_signer, c.rank);
    return std::make_shared<C10dStore>(signed_store, signed_store);
  }
  return std::make_shared<C10dStore>(std::move(store));
}

std::string store_description(const CommConfig& c) {
  if (c.store == CommConfig::StoreKind::kTcp) {
    return "the TCPStore at " + c.master_addr + ":" + std::to_string(c.master_port);
  }
  return "the FileStore at " + c.store_path;
}

std::unique_ptr<Comm> make_gloo_comm(const CommConfig& config,
                                     const std::shared_ptr<Store>& store) {
  return make_gloo(config, c10d_store(store));
}

std::unique_ptr<Comm> make_nccl_comm(const CommConfig& config,
                                     const std::shared_ptr<Store>& store) {
#ifdef DDP_WITH_NCCL
  return make_nccl(config, c10d_store(store));
#else
  (void)store;
  TORCH_INTERNAL_ASSERT(false, "backend \"nccl\" on ", where(config), " in a build without NCCL");
#endif
}

bool nccl_compiled() {
#ifdef DDP_WITH_NCCL
  return true;
#else
  return false;
#endif
}

void check_nccl_runtime(int rank) {
#ifdef DDP_WITH_NCCL
  // Note [NCCL versions]: nccl.h comes from the nvidia-nccl wheel that torch depends on,
  // and the libnccl.so.2 that runs is whichever the dynamic loader found for
  // libtorch_cuda. ddp-cpp itself makes no NCCL call; this only catches a build against
  // one NCCL running against another (a system NCCL first on LD_LIBRARY_PATH, another
  // wheel), where ProcessGroupNCCL's struct layouts and behaviour may differ.
  const int runtime = loaded_nccl_version();
  if (runtime == 0) {
    throw ProcessGroupError(
        "backend \"nccl\" on rank " + std::to_string(rank) +
        ": libnccl.so.2 is not loaded in this process (ncclGetVersion not found), although "
        "this ddp-cpp was built with NCCL " +
        nccl_version_string(NCCL_VERSION_CODE) +
        ". Install the nvidia-nccl wheel that torch depends on, or use \"gloo\".");
  }
  if (runtime / 100 != NCCL_VERSION_CODE / 100) {
    throw ProcessGroupError(
        "backend \"nccl\" on rank " + std::to_string(rank) +
        ": ddp-cpp was compiled against "
        "NCCL " +
        nccl_version_string(NCCL_VERSION_CODE) + " but NCCL " + nccl_version_string(runtime) +
        " is loaded at run time. Build against the nccl.h "
        "of the nvidia-nccl wheel that this torch uses (scripts/build does), and check "
        "that LD_LIBRARY_PATH does not put another libnccl.so.2 first.");
  }
#else
  (void)rank;
#endif
}

std::string nccl_versions() {
#ifdef DDP_WITH_NCCL
  const int runtime = loaded_nccl_version();
  return "compiled " + nccl_version_string(NCCL_VERSION_CODE) + ", loaded " +
         (runtime == 0 ? std::string("not loaded") : nccl_version_string(runtime));
#else
  return "not built";
#endif
}

bool cuda_available() {
#ifdef DDP_WITH_CUDA
  return c10::cuda::device_count() > 0;
#else
  return false;
#endif
}

}  // namespace detail
}  // namespace ddp
