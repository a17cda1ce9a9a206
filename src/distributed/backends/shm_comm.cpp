#include "distributed/backends/shm_comm.h"

#include "distributed/common/check.h"
#include "distributed/rendezvous/rendezvous.h"
#include "distributed/shm/shm_transport.h"
#include "distributed/store_wait.h"
#include "distributed/task_queue.h"

#include <ddp/errors.h>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <unordered_map>

namespace ddp {
namespace detail {
namespace {

std::optional<shm::DType> shm_dtype(c10::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return shm::DType::kFloat32;
    case at::kDouble:
      return shm::DType::kFloat64;
    case at::kHalf:
      return shm::DType::kFloat16;
    case at::kBFloat16:
      return shm::DType::kBFloat16;
    case at::kInt:
      return shm::DType::kInt32;
    case at::kLong:
      return shm::DType::kInt64;
    default:
      return std::nullopt;
  }
}

// The reductions the transport folds; the others (PRODUCT, the bitwise ones) go to the
// Gloo group. AVG is lowered to SUM above this layer.
std::optional<shm::Op> shm_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
      return shm::Op::kSum;
    case ReduceOp::MAX:
      return shm::Op::kMax;
    case ReduceOp::MIN:
      return shm::Op::kMin;
    default:
      return std::nullopt;
  }
}

// The error a failed collective leaves in its future: ddp's own exception types, with
// texts that classify_comm_failure reads the same way (only timeouts say "timed out").
std::exception_ptr collective_error(const shm::Error& e, const CommConfig& c,
                                    const std::string& what) {
  const std::string head = what + " on " + where(c);
  switch (e.kind()) {
    case shm::Error::Kind::kTimeout:
      return std::make_exception_ptr(TimeoutError(head + ": " + e.what() + "."));
    case shm::Error::Kind::kMismatch:
      return std::make_exception_ptr(
          MismatchError(head + ": " + e.what() + ". The process group is broken; destroy it."));
    default:
      return std::make_exception_ptr(
          ProcessGroupError(head + " failed: " + e.what() +
                            ". The process group is broken; destroy it and create a new one."));
  }
}

using StoreSet = std::function<void(const std::string& key, const std::string& value)>;
using StoreTryGet = std::function<std::optional<std::string>(const std::string& key)>;

std::vector<std::optional<std::string>> wait_keys(const CommConfig& c, const StoreTryGet& try_get,
                                                  const std::vector<std::string>& keys) {
  KeyWait got = wait_for_keys(try_get, keys, c.timeout, c.wait_report,
                              [&](const std::vector<size_t>& missing, std::chrono::seconds waited) {
                                return "[ddp] rank " + std::to_string(c.rank) + " has waited " +
                                       std::to_string(waited.count()) + " s for " +
                                       std::to_string(missing.size()) +
                                       " rank(s) to map a shared memory segment";
                              });
  if (!got.complete()) {
    throw TimeoutError("rank " + std::to_string(c.rank) + " of " + std::to_string(c.world_size) +
                       " timed out after " + std::to_string(c.timeout.count()) +
                       " ms setting up shared memory: " + keys[got.missing[0]] +
                       " never came. A rank exited or stopped while the group (or DDP) was "
                       "being set up.");
  }
  return got.values;
}

// The rendezvous of a segment (Note [Shared-memory all-reduce], Note [Zero-copy
// buffers]): rank 0 creates it and publishes where it is under `key`; every other rank
// maps it and says so under key/mapped/<rank>; once all have, rank 0 closes the way in
// (Note [Segments without a name]), so that nothing is left whatever happens next. A failure anywhere is published
// instead, so that every rank learns it. Returns the first failure seen ("" when every
// rank mapped it); *segment is then set on every rank.
template <typename Ptr>
std::string segment_rendezvous(const CommConfig& config, const StoreSet& store_set,
                               const StoreTryGet& store_try_get, const std::string& key,
                               const std::function<Ptr(const std::string& name)>& create,
                               const std::function<Ptr(const std::string& name)>& open,
                               Ptr* segment) {
  auto mapped_key = [&](int rank) { return key + "/mapped/" + std::to_string(rank); };
  std::string failure;
  if (config.rank == 0) {
    try {
      *segment = create(shm::Transport::unique_name());
      store_set(key, (*segment)->where());
    } catch (const shm::Error& e) {
      failure = std::string("rank 0: ") + e.what();
      store_set(key, "!" + failure);
    }
  } else {
    const std::string name = *wait_keys(config, store_try_get, {key})[0];
    if (name.rfind('!', 0) == 0) {
      failure = name.substr(1);
    } else {
      try {
        *segment = open(name);
        store_set(mapped_key(config.rank), "ok");
      } catch (const shm::Error& e) {
        failure = "rank " + std::to_string(config.rank) + ": " + e.what();
        store_set(mapped_key(config.rank), "!" + failure);
      }
    }
  }
  if (failure.empty()) {
    // Every rank learns whether every other rank mapped the segment.
    std::vector<std::string> keys;
    for (int r = 1; r < config.world_size; ++r) keys.push_back(mapped_key(r));
    for (const auto& v : wait_keys(config, store_try_get, keys)) {
      if (v->rfind('!', 0) == 0) {
        failure = v->substr(1);
        break;
      }
    }
  }
  if (*segment) (*segment)->unlink();  // rank 0: every rank has mapped it, or never will
  if (!failure.empty()) *segment = nullptr;
  return failure;
}

// Note [Direct all-reduce]: a peer may still be writing into the buffers of a direct
// all-reduce that failed on this rank (it stops at its next chunk, or never, if it is
// stuck inside a write). Their memory must never be handed out again, so it is kept for
// the life of the process; the group is broken by then anyway.
void keep_for_good(const std::vector<at::Tensor>& tensors) {
  static std::mutex mutex;
  static auto* kept = new std::vector<at::Tensor>();  // never freed, on purpose
  std::lock_guard<std::mutex> lock(mutex);
  kept->insert(kept->end(), tensors.begin(), tensors.end());
}

class ShmComm final : public Comm {
 public:
  ShmComm(CommConfig config, std::unique_ptr<shm::Transport> transport,
          std::unique_ptr<Comm> fallback, bool named_segments)
      : Comm(std::move(config)),
        direct_(transport->direct()),
        transport_(std::move(transport)),
        queue_(std::make_unique<TaskQueue>()),
        fallback_(std::move(fallback)),
        named_segments_(named_segments) {}

  ~ShmComm() override { shutdown(); }

  std::shared_ptr<PendingWork> all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op) override {
    check_devices("all_reduce", tensors);
    const auto dtype = tensors.size() == 1 && tensors[0].defined() && tensors[0].is_cpu()
                           ? shm_dtype(tensors[0].scalar_type())
                           : std::nullopt;
    const auto sop = shm_op(op);
    if (!dtype || !sop) return fallback().all_reduce(tensors, op);
    at::Tensor t = tensors[0];
    size_t offset = 0;
    if (auto pool = pool_of(t, &offset)) {
      return launch("all_reduce", {t}, [t, dtype, sop, pool, offset](shm::Transport& tr) {
        tr.all_reduce_in_pool(*pool, offset, static_cast<size_t>(t.numel()), *dtype, *sop);
      });
    }
    return launch("all_reduce", {t}, [t, dtype, sop](shm::Transport& tr) {
      at::Tensor c = t.is_contiguous() ? t : t.contiguous();
      tr.all_reduce(c.data_ptr(), static_cast<size_t>(c.numel()), *dtype, *sop);
      if (!c.is_same(t)) t.copy_(c);
    });
  }

  std::shared_ptr<PendingWork> broadcast(std::vector<at::Tensor>& tensors, int src) override {
    check_devices("broadcast", tensors);
    DDP_CHECK(src >= 0 && src < config_->world_size, "broadcast on ", where(*config_),
              ": source rank ", src, " is not a rank of this group (0..", config_->world_size - 1,
              ").");
    if (tensors.size() != 1 || !tensors[0].defined() || !tensors[0].is_cpu()) {
      return fallback().broadcast(tensors, src);
    }
    at::Tensor t = tensors[0];
    return launch("broadcast", {t}, [t, src](shm::Transport& tr) {
      at::Tensor c = t.is_contiguous() ? t : t.contiguous();
      tr.broadcast(c.data_ptr(), c.nbytes(), src);
      if (!c.is_same(t)) t.copy_(c);
    });
  }

  std::shared_ptr<PendingWork> all_gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs) override {
    check_devices("all_gather", inputs);
    for (const auto& out : outputs) check_devices("all_gather (outputs)", out);
    const int n = config_->world_size;
    bool carried = inputs.size() == 1 && outputs.size() == 1 && inputs[0].defined() &&
                   inputs[0].is_cpu() && static_cast<int>(outputs[0].size()) == n;
    for (int r = 0; carried && r < n; ++r) {
      const at::Tensor& o = outputs[0][static_cast<size_t>(r)];
      carried = o.defined() && o.is_cpu() && o.nbytes() == inputs[0].nbytes() &&
                o.scalar_type() == inputs[0].scalar_type();
    }
    if (!carried) return fallback().all_gather(outputs, inputs);
    at::Tensor in = inputs[0];
    std::vector<at::Tensor> outs = outputs[0];
    return launch("all_gather", outs, [in, outs](shm::Transport& tr) {
      at::Tensor c = in.is_contiguous() ? in : in.contiguous();
      std::vector<at::Tensor> dst(outs.size());
      std::vector<void*> ptrs(outs.size());
      for (size_t r = 0; r < outs.size(); ++r) {
        dst[r] = outs[r].is_contiguous() ? outs[r] : at::empty_like(c);
        ptrs[r] = dst[r].data_ptr();
      }
      tr.all_gather(c.data_ptr(), c.nbytes(), ptrs);
      for (size_t r = 0; r < outs.size(); ++r) {
        if (!dst[r].is_same(outs[r])) outs[r].copy_(dst[r].view_as(outs[r]));
      }
    });
  }

  // Note [Direct reduce-scatter and all-gather] (shm_transport.h), where every rank may
  // reach every other's memory; else the flat fallbacks over all_reduce and all_gather.
  std::shared_ptr<PendingWork> reduce_scatter_tensor(at::Tensor& output, at::Tensor& input,
                                                     ReduceOp op) override {
    check_flat("reduce_scatter_tensor", input, output);
    const auto dtype = shm_dtype(input.scalar_type());
    const auto sop = shm_op(op);
    if (!direct_ || !dtype || !sop || !input.is_cpu())
      return Comm::reduce_scatter_tensor(output, input, op);
    if (output.numel() == 0) return done_work({output});
    std::vector<at::Tensor> held{input, output};
    return launch("reduce_scatter_tensor", {output}, [held, dtype, sop](shm::Transport& tr) {
      try {
        tr.reduce_scatter_direct(held[0].data_ptr(), held[1].data_ptr(),
                                 static_cast<size_t>(held[1].numel()), *dtype, *sop);
      } catch (...) {
        keep_for_good(held);  // a stuck peer may still read the input
        throw;
      }
    });
  }

  std::shared_ptr<PendingWork> reduce_scatter_tensor_scratch(at::Tensor& output, at::Tensor& input,
                                                             ReduceOp op) override {
    if (direct_ && shm_op(op)) return reduce_scatter_tensor(output, input, op);
    check_flat("reduce_scatter_tensor", input, output);
    return reduce_scatter_by_all_reduce(output, input, op, /*in_place=*/true);
  }

  std::shared_ptr<PendingWork> all_gather_into_tensor(at::Tensor& output,
                                                      at::Tensor& input) override {
    check_flat("all_gather_into_tensor", output, input);
    if (!direct_ || !input.is_cpu()) return Comm::all_gather_into_tensor(output, input);
    if (input.numel() == 0) return done_work({output});
    std::vector<at::Tensor> held{input, output};
    return launch("all_gather_into_tensor", {output}, [held](shm::Transport& tr) {
      try {
        tr.all_gather_direct(held[0].data_ptr(), held[1].data_ptr(), held[0].nbytes());
      } catch (...) {
        keep_for_good(held);
        throw;
      }
    });
  }

  // ---- The rest of torch.distributed's collectives (docs/process_groups.md) ----------
  // Through shared memory: reduce (an all-reduce, into a scratch copy on the ranks other
  // than dst), gather (an all-gather, into scratch tensors there), and reduce_scatter
  // (Comm's, over reduce_scatter_tensor); all_gather's list form is all_gather above. The
  // rest, and whatever the transport does not carry, go to the Gloo group: scatter (as a
  // broadcast of the whole list it moved n times the bytes, and was 2.5 to 4 times slower
  // than Gloo's at 16 MB: bench_collectives), all_to_all, all_to_all_single, point to point.

  std::shared_ptr<PendingWork> reduce(std::vector<at::Tensor>& tensors, int dst,
                                      ReduceOp op) override {
    if (!carries(tensors[0]) || !shm_op(op)) return fallback().reduce(tensors, dst, op);
    return Comm::reduce(tensors, dst, op);  // all_reduce, over the transport
  }
  std::shared_ptr<PendingWork> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                      std::vector<at::Tensor>& inputs, int dst) override {
    if (!inputs[0].is_cpu()) return fallback().gather(outputs, inputs, dst);
    return Comm::gather(outputs, inputs, dst);  // all_gather, over the transport
  }
  std::shared_ptr<PendingWork> scatter(std::vector<at::Tensor>& outputs,
                                       std::vector<std::vector<at::Tensor>>& inputs,
                                       int src) override {
    return fallback().scatter(outputs, inputs, src);
  }
  std::shared_ptr<PendingWork> all_to_all(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs) override {
    return fallback().all_to_all(outputs, inputs);
  }
  std::shared_ptr<PendingWork> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_splits,
                                                 std::vector<int64_t>& input_splits) override {
    return fallback().all_to_all_single(output, input, output_splits, input_splits);
  }
  std::shared_ptr<PendingWork> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return fallback().send(tensors, dst, tag);
  }
  std::shared_ptr<PendingWork> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return fallback().recv(tensors, src, tag);
  }
  std::vector<std::shared_ptr<PendingWork>> batch_p2p(std::vector<P2P>& ops) override {
    return fallback().batch_p2p(ops);
  }

  void barrier() override {
    launch("barrier", {}, [](shm::Transport& tr) { tr.barrier(); })->wait();
  }

  bool reduces_in_place(c10::ScalarType dtype, size_t num_tensors) const override {
    return direct_ && (dtype == at::kFloat || dtype == at::kDouble) &&
           num_tensors <= shm::kMaxSpans;
  }

  std::shared_ptr<PendingWork> all_reduce_in_place(std::vector<at::Tensor>& tensors,
                                                   double scale) override {
    check_devices("all_reduce_in_place", tensors);
    const c10::ScalarType dtype = tensors.empty() ? at::kFloat : tensors[0].scalar_type();
    TORCH_INTERNAL_ASSERT(reduces_in_place(dtype, tensors.size()), "all_reduce_in_place of ",
                          tensors.size(), " ", dtype, " tensors on ", where(*config_));
    for (const at::Tensor& t : tensors) {
      TORCH_INTERNAL_ASSERT(t.defined() && t.is_cpu() && t.is_contiguous() &&
                                t.scalar_type() == dtype,
                            "all_reduce_in_place takes contiguous CPU tensors of one dtype");
    }
    std::vector<at::Tensor> held = tensors;
    return launch("all_reduce", held, [held, dtype, scale](shm::Transport& tr) {
      std::vector<shm::Span> spans;
      spans.reserve(held.size());
      for (const at::Tensor& t : held) {
        spans.push_back(shm::Span{t.data_ptr(), static_cast<size_t>(t.numel())});
      }
      try {
        tr.all_reduce_direct(spans, *shm_dtype(dtype), shm::Op::kSum, scale);
      } catch (...) {
        keep_for_good(held);
        throw;
      }
    });
  }

  std::vector<at::Tensor> allocate_buffers(const std::vector<int64_t>& numels,
                                           const std::vector<at::TensorOptions>& options) override {
    TORCH_INTERNAL_ASSERT(numels.size() == options.size());
    // Buffers the transport reduces go into one pool, each at a page boundary.
    constexpr size_t kPage = 4096;
    std::vector<size_t> offsets(numels.size(), SIZE_MAX);
    size_t total = 0;
    for (size_t i = 0; i < numels.size(); ++i) {
      const auto dtype = c10::typeMetaToScalarType(options[i].dtype());
      if (!options[i].device().is_cpu() || !shm_dtype(dtype) || numels[i] <= 0) continue;
      offsets[i] = total;
      total +=
          (static_cast<size_t>(numels[i]) * c10::elementSize(dtype) + kPage - 1) / kPage * kPage;
    }
    if (total == 0 || !fallback_ || !config_->shm_zero_copy) {
      return Comm::allocate_buffers(numels, options);
    }
    const uint32_t id = ++pools_made_;
    const int n = config_->world_size;
    std::shared_ptr<shm::SharedPool> pool;
    const std::string failure = segment_rendezvous<std::shared_ptr<shm::SharedPool>>(
        *config_, [this](const std::string& k, const std::string& v) { store_set(k, v); },
        [this](const std::string& k) { return store_try_get(k); },
        "ddp/shm/pool/" + std::to_string(id),
        [&](const std::string& name) {
          return shm::SharedPool::create(name, n, total, id, named_segments_);
        },
        [&](const std::string& where) { return shm::SharedPool::open(where, n, total, id); },
        &pool);
    if (!failure.empty()) {
      if (!warned_pool_) {
        std::fprintf(stderr,
                     "[ddp] rank %d: DDP's buckets stay in private memory and are copied "
                     "through the shared segment instead (%s)\n",
                     config_->rank, failure.c_str());
        warned_pool_ = true;
      }
      return Comm::allocate_buffers(numels, options);
    }
    std::vector<at::Tensor> buffers;
    std::lock_guard<std::mutex> lock(pool_mutex_);
    for (auto it = pool_buffers_.begin(); it != pool_buffers_.end();) {
      it = it->second.pool.expired() ? pool_buffers_.erase(it) : std::next(it);
    }
    for (size_t i = 0; i < numels.size(); ++i) {
      if (offsets[i] == SIZE_MAX) {
        buffers.push_back(at::zeros({numels[i]}, options[i]));
        continue;
      }
      void* data = pool->part(config_->rank) + offsets[i];
      // The pool lives while any of its buffers does (posix_fallocate zero-filled it).
      buffers.push_back(at::from_blob(
          data, {numels[i]}, [pool](void*) {}, options[i]));
      pool_buffers_[data] = PoolBuffer{pool, offsets[i], buffers.back().nbytes()};
    }
    return buffers;
  }

  /// Whether `t` is (the start of) a buffer of a live pool: then that pool, and *offset.
  std::shared_ptr<shm::SharedPool> pool_of(const at::Tensor& t, size_t* offset) {
    if (!t.is_contiguous()) return nullptr;
    std::lock_guard<std::mutex> lock(pool_mutex_);
    auto it = pool_buffers_.find(t.data_ptr());
    if (it == pool_buffers_.end() || t.nbytes() > it->second.bytes) return nullptr;
    *offset = it->second.offset;
    return it->second.pool.lock();
  }

  void store_set(const std::string& key, const std::string& value) override {
    fallback().store_set(key, value);
  }
  std::optional<std::string> store_try_get(const std::string& key) override {
    return fallback().store_try_get(key);
  }

  void abort_transport() {
    if (transport_) transport_->abort();
  }

  void shutdown() override {
    if (queue_) {
      // Work still queued or running fails: the waits of this rank end at once and the
      // peers' with an abort (a peer waiting for this rank would otherwise wait for the
      // whole timeout).
      queue_->stop([this] { transport_->abort(); });
      queue_.reset();
      transport_.reset();
    }
    if (fallback_) {
      fallback_->shutdown();
      fallback_.reset();
    }
  }

 private:
  // Whether the transport reduces `t` (a CPU tensor of a dtype it folds).
  static bool carries(const at::Tensor& t) {
    return t.defined() && t.is_cpu() && shm_dtype(t.scalar_type()).has_value();
  }

  Comm& fallback() {
    // A hierarchy's host group has none: it only ever gets all-reduces and broadcasts
    // that shared memory carries (Note [Hierarchical all-reduce]).
    DDP_CHECK(fallback_, "process group of ", where(*config_),
              " was already shut down, or has no Gloo group for this call");
    return *fallback_;
  }

  std::shared_ptr<PendingWork> launch(const char* what, std::vector<at::Tensor> result,
                                      std::function<void(shm::Transport&)> body) {
    DDP_CHECK(queue_, "process group of ", where(*config_), " was already shut down");
    auto future = tensor_list_future();
    auto config = config_;
    std::string name = what;
    shm::Transport* transport = transport_.get();  // outlives the queue's worker
    queue_->submit([future, config, name, transport, result = std::move(result),
                    body = std::move(body)]() mutable {
      try {
        body(*transport);
        body = nullptr;  // what it holds goes before the waiter wakes
      } catch (const shm::Error& e) {
        future->setError(collective_error(e, *config, name));
        return;
      } catch (const std::exception& e) {
        future->setError(std::make_exception_ptr(
            ProcessGroupError(name + " on " + where(*config) + " failed: " + cause_text(e) +
                              ". The process group is broken; destroy it and create a new one.")));
        return;
      }
      future->markCompleted(c10::IValue(result));
    });
    return future_work(std::move(future));
  }

  struct PoolBuffer {
    std::weak_ptr<shm::SharedPool> pool;
    size_t offset = 0;
    size_t bytes = 0;
  };

  bool direct_ = false;  // Note [Direct all-reduce]: every rank may reach every other's memory
  std::unique_ptr<shm::Transport> transport_;
  std::unique_ptr<TaskQueue> queue_;  // stopped before transport_ goes
  std::unique_ptr<Comm> fallback_;
  bool named_segments_ = false;  // Note [Segments without a name]
  uint32_t pools_made_ = 0;
  bool warned_pool_ = false;
  std::mutex pool_mutex_;
  std::unordered_map<const void*, PoolBuffer> pool_buffers_;  // Note [Zero-copy buffers]
};

}  // namespace

bool shm_reduces(c10::ScalarType dtype) { return shm_dtype(dtype).has_value(); }

void abort_shm_comm(Comm& comm) {
  if (auto* shm = dynamic_cast<ShmComm*>(&comm)) shm->abort_transport();
}

std::unique_ptr<Comm> make_shm_comm(const CommConfig& config, const ShmSetup& setup,
                                    std::string* why_not) {
  shm::Options o;
  o.rank = config.rank;
  o.world_size = config.world_size;
  o.timeout = config.timeout;
  o.slice_bytes = config.shm_slice_bytes;
  if (config.shm_direct_chunk_bytes > 0) o.direct_chunk_bytes = config.shm_direct_chunk_bytes;

  // Note [Segments without a name]: a rank in another pid namespace than rank 0 cannot
  // open rank 0's descriptors through /proc; there, segments have a name in /dev/shm.
  const bool named =
      std::any_of(setup.identities.begin(), setup.identities.end(), [&](const HostIdentity& peer) {
        return !same_pid_namespace(peer, setup.identities[0]);
      });
  std::unique_ptr<shm::Transport> transport;
  const std::string failure = segment_rendezvous<std::unique_ptr<shm::Transport>>(
      config, setup.store_set, setup.store_try_get, "ddp/shm/segment",
      [&](const std::string& name) { return shm::Transport::create(name, o, named); },
      [&](const std::string& where) { return shm::Transport::open(where, o); }, &transport);
  if (!failure.empty()) {
    *why_not = failure;
    return nullptr;
  }
  for (int r = 0; r < config.world_size; ++r) {
    const HostIdentity& peer = setup.identities[static_cast<size_t>(r)];
    if (r != config.rank &&
        same_pid_namespace(peer, setup.identities[static_cast<size_t>(config.rank)])) {
      transport->set_peer_pid(r, peer.pid);
    }
  }
  // Collective, like the segment's rendezvous: all ranks agree whether DDP's gradients
  // go straight between their memory (Note [Direct all-reduce]).
  std::string why_not_direct;
  try {
    const bool wanted = config.shm_direct;
    if (!transport->enable_direct(wanted, &why_not_direct) && wanted && config.rank == 0) {
      std::fprintf(stderr,
                   "[ddp] shm: DDP's gradients go through shared buffers, not straight between "
                   "the ranks' memory (%s)\n",
                   why_not_direct.c_str());
    }
  } catch (const shm::Error& e) {
    std::rethrow_exception(collective_error(e, config, "setting up shared memory"));
  }
  CommConfig c = config;
  c.backend = "shm";
  auto comm =
      std::make_unique<ShmComm>(std::move(c), std::move(transport), setup.make_fallback(), named);
  // No rank returns before every rank has its Gloo group too: one that released its
  // group at once would otherwise break a peer still connecting to it.
  comm->barrier();
  return comm;
}

}  // namespace detail
}  // namespace ddp
