// Every c10d call of ddp-cpp is in this file.
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

#include "distributed/common/check.h"
#include "distributed/comm.h"
#include "distributed/backends/device_standin.h"
#include "distributed/backends/hier_comm.h"
#include "distributed/rendezvous/host_identity.h"
#include "distributed/backends/shm_comm.h"
#include "distributed/store_wait.h"
#include "distributed/debug/traced_comm.h"

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

#include <signal.h>
#include <unistd.h>

namespace ddp {
namespace detail {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
      return c10d::ReduceOp::SUM;
    case ReduceOp::MAX:
      return c10d::ReduceOp::MAX;
    case ReduceOp::MIN:
      return c10d::ReduceOp::MIN;
    case ReduceOp::AVG:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "AVG must be lowered to SUM before reaching c10d");
}

}  // namespace

std::string cause_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

namespace {

std::string where(const CommConfig& c) {
  return "rank " + std::to_string(c.rank) + " of " + std::to_string(c.world_size) + " (" +
         c.backend + ", " + c.init_method + ")";
}

class C10dWork final : public PendingWork {
 public:
  C10dWork(c10::intrusive_ptr<c10d::Work> work, std::shared_ptr<const CommConfig> config,
           std::string what)
      : work_(std::move(work)), config_(std::move(config)), what_(std::move(what)) {}

  void wait() override {
    try {
      // Note [NCCL waits on the stream]: with an explicit timeout, WorkNCCL::wait blocks
      // the host until the kernel finishes. Without one it only makes the current CUDA
      // stream wait on NCCL's (an event), which is what DDP wants; NCCL's watchdog
      // enforces the group's timeout instead. Gloo's wait is a host wait either way.
      if (config_->backend == "nccl") {
        work_->wait();
      } else {
        work_->wait(config_->timeout);
      }
    } catch (const std::exception& e) {
      rethrow_comm_error(e, *config_, what_);
    }
  }

  c10::intrusive_ptr<c10::ivalue::Future> future() override { return work_->getFuture(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  // Shared, not borrowed: a Work may outlive its group's shutdown().
  std::shared_ptr<const CommConfig> config_;
  std::string what_;
};

// A finished collective, for the world-size-1 path.
class DoneWork final : public PendingWork {
 public:
  explicit DoneWork(std::vector<at::Tensor> value) : value_(std::move(value)) {}
  void wait() override {}
  c10::intrusive_ptr<c10::ivalue::Future> future() override {
    auto fut =
        c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    fut->markCompleted(c10::IValue(value_));
    return fut;
  }

 private:
  std::vector<at::Tensor> value_;
};

// A flat collective's work. Some backends' works for these have no future (Gloo's
// reduce_scatter in 2.x: "Work::getFuture not implemented"); then future() waits for
// the work and hands back a completed future holding the output, as the others do.
class FlatWork final : public PendingWork {
 public:
  FlatWork(std::shared_ptr<PendingWork> inner, at::Tensor output)
      : inner_(std::move(inner)), output_(std::move(output)) {}
  void wait() override { inner_->wait(); }
  c10::intrusive_ptr<c10::ivalue::Future> future() override {
    try {
      return inner_->future();
    } catch (const c10::Error&) {
      inner_->wait();
      return DoneWork({output_}).future();
    }
  }

 private:
  std::shared_ptr<PendingWork> inner_;
  at::Tensor output_;
};

void store_set_on(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::optional<std::string> store_try_get_on(c10d::Store& store, const std::string& key) {
  if (!store.check({key})) return std::nullopt;
  const std::vector<uint8_t> bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
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
    check_flat("reduce_scatter_tensor", input, output);
    if (native_reduce_scatter_) {
      c10d::ReduceScatterOptions opts;
      opts.reduceOp = to_c10d(op);
      opts.timeout = config_->timeout;
      if (auto work = run_native("reduce_scatter_tensor", native_reduce_scatter_,
                                 [&] { return pg()->_reduce_scatter_base(output, input, opts); })) {
        return std::make_shared<FlatWork>(std::move(work), output);
      }
    }
    return reduce_scatter_by_all_reduce(output, input, op);
  }

  std::shared_ptr<PendingWork> all_gather_into_tensor(at::Tensor& output,
                                                      at::Tensor& input) override {
    check_flat("all_gather_into_tensor", output, input);
    if (native_all_gather_) {
      c10d::AllgatherOptions opts;
      opts.timeout = config_->timeout;
      if (auto work = run_native("all_gather_into_tensor", native_all_gather_,
                                 [&] { return pg()->_allgather_base(output, input, opts); })) {
        return std::make_shared<FlatWork>(std::move(work), output);
      }
    }
    return all_gather_by_views(output, input);
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
    return std::make_shared<C10dWork>(std::move(work), config_, what);
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
    return std::make_shared<C10dWork>(std::move(work), config_, what);
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
  std::atomic<bool> native_reduce_scatter_{true};
  std::atomic<bool> native_all_gather_{true};
};

// World size 1: nothing to exchange, every collective is the identity.
class LocalComm final : public Comm {
 public:
  explicit LocalComm(CommConfig config) : Comm(std::move(config)) {}
  bool trivial() const override { return true; }
  // The same device checks as with peers, so that code that runs at world size 1
  // does not first fail at 2.
  std::shared_ptr<PendingWork> all_reduce(std::vector<at::Tensor>& tensors, ReduceOp) override {
    check_devices("all_reduce", tensors);
    return std::make_shared<DoneWork>(tensors);
  }
  std::shared_ptr<PendingWork> broadcast(std::vector<at::Tensor>& tensors, int) override {
    check_devices("broadcast", tensors);
    return std::make_shared<DoneWork>(tensors);
  }
  std::shared_ptr<PendingWork> all_gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs) override {
    check_devices("all_gather", inputs);
    for (size_t i = 0; i < inputs.size(); ++i) outputs[i][0].copy_(inputs[i]);
    return std::make_shared<DoneWork>(inputs);
  }
  void barrier() override {}
  void shutdown() override {}
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

std::string store_description(const CommConfig& c) {
  if (c.store == CommConfig::StoreKind::kTcp) {
    return "the TCPStore at " + c.master_addr + ":" + std::to_string(c.master_port);
  }
  return "the FileStore at " + c.store_path;
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

// ---- Devices (Note [Device discipline]) ------------------------------------------------

void Comm::store_set(const std::string& key, const std::string&) {
  TORCH_INTERNAL_ASSERT(false, "this group has no store (key ", key, ")");
}

std::optional<std::string> Comm::store_try_get(const std::string& key) {
  TORCH_INTERNAL_ASSERT(false, "this group has no store (key ", key, ")");
}

c10::Device Comm::device() const {
  if (config_->backend == "nccl") {
    return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(config_->local_rank));
  }
  return c10::Device(c10::DeviceType::CPU);
}

at::Tensor Comm::to_device(const at::Tensor& t) {
  const c10::Device d = device();
  if (d.is_cuda() && t.is_cpu()) {
    // From pinned memory without blocking, as PyTorch's reducer copies its bookkeeping: a
    // pageable copy would synchronise the stream. The caching host allocator keeps the
    // pinned block until the copy is done.
    return t.pin_memory().to(d, /*non_blocking=*/true);
  }
  return t.to(d);
}

at::Tensor Comm::to_host(const at::Tensor& t) { return t.to(c10::Device(c10::DeviceType::CPU)); }

bool Comm::accepts(const c10::Device& d) const {
  // NCCL reads only this rank's GPU; Gloo reduces host memory and CUDA tensors.
  if (config_->backend == "nccl" || config_->backend == "standin") return d == device();
  return d.is_cpu() || d.is_cuda();
}

void Comm::check_devices(const char* what, const std::vector<at::Tensor>& tensors) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) continue;  // the backend names that itself
    const c10::Device d = tensors[i].device();
    if (C10_UNLIKELY(!accepts(d))) {
      DDP_CHECK(false, what, " on ", where(*config_), ": tensor ", i, " is on ", d,
                ", but this group's collectives take tensors on ", device(),
                config_->backend == "nccl"      ? " (the \"nccl\" backend reads only the GPU "
                                                  "of this rank's local rank)"
                : config_->backend == "standin" ? " (like \"nccl\", the \"standin\" backend "
                                                  "reads only this rank's device: a tensor "
                                                  "made on the host must be moved first)"
                                                : "",
                ". Move it first, e.g. t.to(pg.device()).");
    }
    if (C10_UNLIKELY(i > 0 && tensors[0].defined() && d != tensors[0].device())) {
      DDP_CHECK(false, what, " on ", where(*config_), ": tensor ", i, " is on ", d,
                " but tensor 0 is on ", tensors[0].device(),
                "; one collective takes "
                "tensors of one device.");
    }
  }
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

CommFailure classify_comm_failure(const std::string& cause) {
  const std::string t = lower(cause);
  const bool timeout =
      t.find("timed out") != std::string::npos || t.find("timeout") != std::string::npos;
  return timeout ? CommFailure::kTimeout : CommFailure::kBroken;
}

bool is_unsupported_op(const std::string& cause) {
  // 1.13: "ProcessGroupGloo does not support _reduce_scatter_base", "no support for
  // _allgather_base in Gloo process group".
  const std::string t = lower(cause);
  return t.find("does not support") != std::string::npos ||
         t.find("no support for") != std::string::npos;
}

void throw_comm_failure(CommFailure kind, const std::string& message) {
  if (kind == CommFailure::kTimeout) throw TimeoutError(message);
  throw ProcessGroupError(message);
}

void rethrow_comm_error(const std::exception& e, const CommConfig& config,
                        const std::string& what) {
  const std::string text = cause_text(e);
  if (dynamic_cast<const TimeoutError*>(&e) || dynamic_cast<const ProcessGroupError*>(&e)) {
    throw;  // already ours
  }
  if (classify_comm_failure(text) == CommFailure::kTimeout) {
    throw TimeoutError(what + " on " + where(config) + " timed out after " +
                       std::to_string(config.timeout.count()) +
                       " ms: a peer did not answer. Check that every rank is alive and "
                       "calls the same collectives in the same order, or raise the "
                       "timeout. Cause: " +
                       text);
  }
  throw ProcessGroupError(what + " on " + where(config) +
                          " failed; the process group is broken (state unknown), destroy "
                          "it and create a new one. Cause: " +
                          text);
}

// Note [Waiting that talks] for the rendezvous: each rank announces itself under
// ddp/arrived/<rank> and waits for all the others, saying whom it waits for, before the
// backend's own rendezvous (which waits silently and cannot say who is missing) starts.
// The announcement is the rank's host identity (Note [Same host]); all of them are
// returned, in rank order.
std::vector<HostIdentity> wait_for_arrivals(const CommConfig& c, c10d::Store& store) {
  try {
    store_set_on(store, "ddp/arrived/" + std::to_string(c.rank), encode(local_host_identity()));
  } catch (const std::exception& e) {
    rethrow_comm_error(e, c, "announcing this rank at the rendezvous");
  }
  std::vector<std::string> keys;
  for (int r = 0; r < c.world_size; ++r) keys.push_back("ddp/arrived/" + std::to_string(r));
  const std::string where_text = store_description(c);
  KeyWait got;
  try {
    got = wait_for_keys([&store](const std::string& key) { return store_try_get_on(store, key); },
                        keys, c.timeout,
                        [&](const std::vector<size_t>& missing, std::chrono::seconds waited) {
                          std::vector<int> ranks(missing.begin(), missing.end());
                          return "[ddp] rank " + std::to_string(c.rank) + " of " +
                                 std::to_string(c.world_size) + " has waited " +
                                 std::to_string(waited.count()) + " s at " + where_text +
                                 " for rank(s) " + join_ranks(ranks) + " to join (timeout " +
                                 std::to_string(c.timeout.count() / 1000) + " s)";
                        });
  } catch (const std::exception& e) {
    rethrow_comm_error(e, c, "waiting for the other ranks at the rendezvous");
  }
  if (got.complete()) {
    std::vector<HostIdentity> ids(got.values.size());
    for (size_t r = 0; r < ids.size(); ++r) decode(*got.values[r], ids[r]);
    return ids;
  }
  std::vector<int> ranks(got.missing.begin(), got.missing.end());
  throw TimeoutError("rank " + std::to_string(c.rank) + " of " + std::to_string(c.world_size) +
                     " waited " + std::to_string(c.timeout.count()) + " ms at " + where_text +
                     " for the other ranks to join; rank(s) " + join_ranks(ranks) +
                     " never arrived. Start all " + std::to_string(c.world_size) +
                     " ranks with the same rendezvous settings (WORLD_SIZE counts every "
                     "process of the job), or raise the timeout.");
}

namespace {

std::string describe_host(const HostIdentity& id) {
  return "'" + (id.hostname.empty() ? std::string("?") : id.hostname) + "' (boot id " +
         (id.boot_id.empty() ? std::string("unknown") : id.boot_id.substr(0, 8)) + ", /dev/shm " +
         std::to_string(id.shm_device) + ":" + std::to_string(id.shm_inode) + ")";
}

// A shared-memory setup whose rendezvous keys live in `store`.
ShmSetup shm_setup_on(const c10::intrusive_ptr<c10d::Store>& store) {
  ShmSetup setup;
  setup.store_set = [store](const std::string& k, const std::string& v) {
    store_set_on(*store, k, v);
  };
  setup.store_try_get = [store](const std::string& k) { return store_try_get_on(*store, k); };
  return setup;
}

// The "shm" backend when every rank shares this host, or nullptr for Gloo: backend ""
// falls back quietly (rank 0 says why when the segment could not be made); backend
// "shm" throws, saying which ranks are elsewhere or what failed.
std::unique_ptr<Comm> make_shm(const CommConfig& c, const c10::intrusive_ptr<c10d::Store>& store,
                               const std::vector<HostIdentity>& ids) {
  const bool asked = c.backend == "shm";
  for (size_t r = 1; r < ids.size(); ++r) {
    if (same_shm_host(ids[0], ids[r])) continue;
    if (!asked) return nullptr;
    throw ProcessGroupError("backend \"shm\" on rank " + std::to_string(c.rank) + " of " +
                            std::to_string(c.world_size) +
                            ": shared memory needs every rank of the group on one host, but "
                            "rank 0 is on " +
                            describe_host(ids[0]) + " and rank " + std::to_string(r) + " on " +
                            describe_host(ids[r]) +
                            ". Use backend \"gloo\", or an empty backend, which picks shared "
                            "memory only when the ranks share a host.");
  }
  ShmSetup setup = shm_setup_on(store);
  setup.identities = ids;
  setup.make_fallback = [&c, &store]() {
    CommConfig g = c;
    g.backend = "gloo";
    return make_gloo(g, store);
  };
  std::string why_not;
  auto comm = make_shm_comm(c, setup, &why_not);
  if (comm) return comm;
  if (asked) {
    throw ProcessGroupError("backend \"shm\" on rank " + std::to_string(c.rank) + " of " +
                            std::to_string(c.world_size) +
                            ": the shared memory segment could not be set up: " + why_not +
                            ". Use backend \"gloo\" instead.");
  }
  if (c.rank == 0) {
    std::fprintf(stderr, "[ddp] shared memory is not usable (%s); using gloo\n", why_not.c_str());
  }
  return nullptr;
}

// Note [Hierarchical all-reduce]: for an empty backend on CPUs, when the ranks span
// hosts and some host has several. nullptr when the hierarchy does not apply.
std::unique_ptr<Comm> make_hier(const CommConfig& c, const c10::intrusive_ptr<c10d::Store>& store,
                                const std::vector<HostIdentity>& ids) {
  const HostLayout layout = host_layout(ids, c.rank);
  if (!wants_hierarchy(layout)) return nullptr;
  auto global = make_gloo(c, store);
  std::unique_ptr<Comm> local;
  std::string why_not;
  if (layout.local_size > 1) {
    c10::intrusive_ptr<c10d::Store> host_store =
        c10::make_intrusive<c10d::PrefixStore>("ddp/hier/host" + std::to_string(layout.host),
                                               store);
    CommConfig lc = c;
    lc.rank = layout.local_rank;
    lc.world_size = layout.local_size;
    ShmSetup setup = shm_setup_on(host_store);
    for (int r : layout.host_ranks) setup.identities.push_back(ids[static_cast<size_t>(r)]);
    setup.make_fallback = [] { return std::unique_ptr<Comm>(); };  // all_reduce, broadcast only
    local = make_shm_comm(lc, setup, &why_not);
  }
  // All hosts or none: a host without shared memory makes every rank use plain Gloo.
  at::Tensor ok = at::full({1}, local || layout.local_size == 1 ? 1 : 0, at::kInt);
  std::vector<at::Tensor> flag{ok};
  global->all_reduce(flag, ReduceOp::MIN)->wait();
  if (ok.item<int>() == 0) {
    if (!why_not.empty()) {
      std::fprintf(stderr,
                   "[ddp] rank %d: shared memory is not usable on this host (%s); the group "
                   "uses gloo without the hierarchy\n",
                   c.rank, why_not.c_str());
    }
    if (local) local->shutdown();
    return global;
  }
  std::unique_ptr<Comm> leaders;
  if (layout.leader()) {
    CommConfig gc = c;
    gc.rank = layout.host;
    gc.world_size = layout.hosts;
    leaders = make_gloo(gc, c10::make_intrusive<c10d::PrefixStore>("ddp/hier/leaders", store));
  }
  return make_hier_comm(c, layout, std::move(global), std::move(local), std::move(leaders));
}

}  // namespace

// Note [Interface from peers]: the interface and local placement of a file:// group.
static void place_from_peers(CommConfig& c, const std::vector<HostIdentity>& ids) {
  const LocalPlacement p = local_placement(ids, c.rank);
  if (c.local_world_size < 0) c.local_world_size = p.local_world_size;
  if (c.local_rank < 0) c.local_rank = p.local_rank;
  if (!c.interface_from_peers || !c.gloo_interface.empty()) return;  // GLOO_SOCKET_IFNAME
  std::string error;
  c.gloo_interface = choose_gloo_interface(ids, c.rank, &error);
  if (!error.empty()) {
    throw ProcessGroupError("rank " + std::to_string(c.rank) + " of " +
                            std::to_string(c.world_size) + " (" + c.init_method +
                            "): the ranks span hosts, and Gloo needs an interface that reaches "
                            "them all, but " +
                            error +
                            ". Set GLOO_SOCKET_IFNAME on every rank to the interface that "
                            "connects the hosts.");
  }
  if (c.gloo_interface.empty()) c.gloo_address = "127.0.0.1";
}

std::unique_ptr<Comm> Comm::create(const CommConfig& config) {
  if (config.world_size == 1 && !config.single_rank_group) {
    CommConfig c = config;
    if (c.local_rank < 0) c.local_rank = 0;
    if (c.local_world_size < 0) c.local_world_size = 1;
    std::unique_ptr<Comm> local = std::make_unique<LocalComm>(c);
    return c.backend == "standin" ? make_standin_comm(std::move(local)) : std::move(local);
  }
  CommConfig c = config;

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
    const std::string t = lower(text);
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

  const std::vector<HostIdentity> identities = wait_for_arrivals(c, *store);
  if (c.placement_from_peers) place_from_peers(c, identities);

  // Every collective is numbered and recorded (Note [Flight recorder]), and checked
  // across ranks in debug mode (Note [Collective fingerprints]), unless both are off.
  auto traced = [&c](std::unique_ptr<Comm> comm) -> std::unique_ptr<Comm> {
    if (!c.debug_detail && c.flight_recorder_entries == 0) return comm;
    return std::make_unique<TracedComm>(std::move(comm));
  };
  try {
    if (c.backend == "shm" || c.backend_auto) {
      if (auto comm = make_shm(c, store, identities)) return traced(std::move(comm));
    }
    if (c.backend_auto) {
      if (auto comm = make_hier(c, store, identities)) return traced(std::move(comm));
    }
    if (c.backend == "gloo") return traced(make_gloo(c, store));
    if (c.backend == "standin") return traced(make_standin_comm(make_gloo(c, store)));
#ifdef DDP_WITH_NCCL
    if (c.backend == "nccl") return traced(make_nccl(c, store));
#endif
  } catch (const std::exception& e) {
    if (classify_comm_failure(cause_text(e)) == CommFailure::kTimeout) {
      throw TimeoutError("rank " + std::to_string(c.rank) + " of " + std::to_string(c.world_size) +
                         " waited " + std::to_string(c.timeout.count()) + " ms at " +
                         store_description(c) +
                         " for the other ranks to join, and not all of them did. Start "
                         "all " +
                         std::to_string(c.world_size) +
                         " ranks with the same rendezvous settings, or raise the timeout. "
                         "Cause: " +
                         cause_text(e));
    }
    rethrow_comm_error(e, c, "creating the " + c.backend + " process group");
  }
  TORCH_INTERNAL_ASSERT(false, "backend '", c.backend, "' reached Comm::create unchecked");
}

}  // namespace detail
}  // namespace ddp
