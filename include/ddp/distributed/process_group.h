#pragma once

// Process groups: who am I (rank), how many are we (world size), and the collectives
// that connect us. Names follow torch.distributed. The API is in one header per concern:
//   ddp/distributed/options.h        InitOptions, RankInfo, ReduceOp
//   ddp/distributed/work.h           Work, the handle of an asynchronous collective
//   ddp/distributed/process_group.h  ProcessGroup and its collectives (this header)
//   ddp/distributed/default_group.h  init_process_group, and every collective as a free
//                                    function on a group (the default one when null)
//   ddp/distributed/groups.h         new_group and the subgroups (in ddp/ddp.h)
// This header includes the first three, so that one include gives the collectives.

#include <ddp/distributed/options.h>
#include <ddp/distributed/work.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

class ProcessGroup;
struct GroupOptions;

namespace detail {
class Comm;
class PendingWork;
/// A group over an already connected Comm (the library's own, or a test double).
std::shared_ptr<ProcessGroup> make_process_group(std::unique_ptr<Comm> comm);
Comm& comm_of(const ProcessGroup& pg);
}  // namespace detail

/// One send or receive of batch_isend_irecv (torch.distributed.P2POp).
///
/// Example:
///   std::vector<ddp::P2POp> ops{ddp::P2POp(ddp::P2POp::ISEND, out, (rank + 1) % world),
///                               ddp::P2POp(ddp::P2POp::IRECV, in, (rank + world - 1) % world)};
///   for (auto& work : ddp::batch_isend_irecv(ops)) work.wait();
struct P2POp {
  enum Op { ISEND, IRECV };
  P2POp(Op op, at::Tensor tensor, int peer, int tag = 0)
      : op(op), tensor(std::move(tensor)), peer(peer), tag(tag) {}
  /// ISEND sends `tensor` to `peer`; IRECV receives into it from `peer`.
  Op op;
  at::Tensor tensor;
  /// The other rank (never this one).
  int peer;
  /// Matches a send with the receive of the same tag between the same two ranks.
  int tag = 0;
};

/// A group of processes that run collectives together. Create one with
/// init_process_group (the default group) or ProcessGroup::create (an explicit one,
/// used for several groups per process, e.g. one per thread in tests).
class ProcessGroup {
 public:
  static std::shared_ptr<ProcessGroup> create(const InitOptions& options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// This rank within the group; -1 on a rank that is not a member (torch's
  /// get_rank(group) for a non-member).
  int rank() const;
  int size() const;
  /// False on a rank outside a group made by new_group: the group's collectives refuse
  /// there, as PyTorch's GroupMember.NON_GROUP_MEMBER does.
  bool is_member() const;
  /// The members' global ranks (ranks of the group that init_process_group or create
  /// made), in group rank order: 0..size()-1 for such a group itself.
  const std::vector<int>& ranks() const;
  int local_rank() const;
  int local_world_size() const;
  /// The backend in use: "gloo", "nccl", "shm" (one host), "hier" (shared memory within
  /// hosts, Gloo between them) or "standin" (DDP_DEVICE_STANDIN); an empty
  /// InitOptions::backend is resolved here.
  const std::string& backend() const;
  std::chrono::milliseconds timeout() const;
  /// The device this rank computes on: cuda:local_rank for "nccl", standin:local_rank
  /// for "standin", else CPU.
  c10::Device device() const;

  void barrier();
  /// A barrier that names who is late: rank 0 waits up to `timeout` for every rank and
  /// throws TimeoutError naming those that did not arrive; the others throw it too,
  /// naming the same ranks (or rank 0, if it never answers). Uses the rendezvous store,
  /// not the backend, so it works while a backend collective is stuck.
  void monitored_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks = true);
  /// In place. AVG divides the sum by size().
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM);
  /// In place: every rank ends with src's tensor.
  void broadcast(at::Tensor& tensor, int src = 0);
  /// Every rank's tensor (same shape and dtype everywhere), in rank order.
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
  /// Every rank's bytes (any length), in rank order.
  std::vector<std::string> all_gather_bytes(const std::string& bytes);
  /// torch.distributed.reduce_scatter_tensor: `input` holds size() equal chunks of
  /// output's numel; rank r's `output` receives the reduction of every rank's chunk r.
  /// AVG divides by size(). `input` is left as it was.
  void reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                             ReduceOp op = ReduceOp::SUM);
  /// torch.distributed.all_gather_into_tensor: chunk r of `output` (size() chunks of
  /// input's numel, contiguous) receives rank r's `input`.
  void all_gather_into_tensor(at::Tensor& output, const at::Tensor& input);

  /// Launches an all-reduce and returns at once; the tensors are reduced in place
  /// (AVG divides on completion). For DDP's buckets and comm hooks.
  Work all_reduce_async(std::vector<at::Tensor>& tensors, ReduceOp op = ReduceOp::SUM);
  Work broadcast_async(std::vector<at::Tensor>& tensors, int src = 0);
  /// reduce_scatter_tensor, launched; the future yields [output]. AVG divides `input`
  /// first (in place), as all_reduce_async does.
  Work reduce_scatter_tensor_async(at::Tensor& output, at::Tensor& input,
                                   ReduceOp op = ReduceOp::SUM);
  /// all_gather_into_tensor, launched; the future yields [output].
  Work all_gather_into_tensor_async(at::Tensor& output, at::Tensor& input);

  // ---- The rest of torch.distributed's collectives (docs/process_groups.md) -------
  // Each checks its arguments on this rank before anything is sent, naming what was
  // expected and what it got. Shapes and dtypes that differ between ranks cannot be seen
  // on one rank: DDP_DEBUG=detail names them (Note [Collective fingerprints]). Each
  // _async form returns at once; its future yields the outputs.

  /// torch.distributed.reduce: rank `dst`'s `tensor` receives the reduction of every
  /// rank's; the other ranks' tensors are left as they were.
  void reduce(at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::SUM);
  Work reduce_async(at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::SUM);
  /// torch.distributed.gather: on rank `dst`, gather_list[r] receives rank r's `tensor`
  /// (size() tensors of its shape and dtype); on the other ranks gather_list must be
  /// empty (Python's None).
  void gather(const at::Tensor& tensor, std::vector<at::Tensor>& gather_list, int dst = 0);
  Work gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& gather_list, int dst = 0);
  /// torch.distributed.scatter: rank r's `tensor` receives scatter_list[r] of rank `src`
  /// (size() tensors of tensor's shape and dtype there; empty elsewhere).
  void scatter(at::Tensor& tensor, const std::vector<at::Tensor>& scatter_list, int src = 0);
  Work scatter_async(at::Tensor& tensor, const std::vector<at::Tensor>& scatter_list, int src = 0);
  /// torch.distributed.reduce_scatter: rank r's `output` receives the reduction of
  /// input_list[r] over all ranks (size() tensors of output's shape and dtype).
  void reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& input_list,
                      ReduceOp op = ReduceOp::SUM);
  Work reduce_scatter_async(at::Tensor& output, const std::vector<at::Tensor>& input_list,
                            ReduceOp op = ReduceOp::SUM);
  /// torch.distributed.all_gather: tensor_list[r] receives rank r's `tensor`. Every
  /// rank's tensor has one shape and dtype; tensor_list holds size() tensors of them.
  void all_gather(std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor);
  Work all_gather_async(std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor);
  /// torch.distributed.all_to_all: output_list[r] receives rank r's input_list[this
  /// rank]. size() tensors each, of one dtype; shapes may differ from pair to pair, as
  /// long as each output matches what its peer sends.
  void all_to_all(std::vector<at::Tensor>& output_list, const std::vector<at::Tensor>& input_list);
  Work all_to_all_async(std::vector<at::Tensor>& output_list,
                        const std::vector<at::Tensor>& input_list);
  /// torch.distributed.all_to_all_single: `input` is split along dim 0 into size()
  /// parts of input_split_sizes rows (empty: equal parts), part r going to rank r;
  /// `output` is the concatenation along dim 0 of what each rank sent here, rank r's
  /// part having output_split_sizes[r] rows (empty: equal parts). The split sizes of
  /// every pair of ranks must agree (DDP_DEBUG=detail checks it).
  void all_to_all_single(at::Tensor& output, const at::Tensor& input,
                         const std::vector<int64_t>& output_split_sizes = {},
                         const std::vector<int64_t>& input_split_sizes = {});
  Work all_to_all_single_async(at::Tensor& output, const at::Tensor& input,
                               const std::vector<int64_t>& output_split_sizes = {},
                               const std::vector<int64_t>& input_split_sizes = {});

  // ---- Point to point ----------------------------------------------------------------
  /// torch.distributed.send: blocks until `tensor` was handed to rank `dst` (!= rank()).
  void send(const at::Tensor& tensor, int dst, int tag = 0);
  /// torch.distributed.recv: fills `tensor` from rank `src`, or from whichever rank sends
  /// first with this tag when src is nullopt; returns the sender's rank.
  int recv(at::Tensor& tensor, std::optional<int> src = std::nullopt, int tag = 0);
  /// send, launched; the caller keeps `tensor` unchanged until wait().
  Work isend(const at::Tensor& tensor, int dst, int tag = 0);
  /// recv, launched; after wait(), Work::source_rank() names the sender.
  Work irecv(at::Tensor& tensor, std::optional<int> src = std::nullopt, int tag = 0);
  /// torch.distributed.batch_isend_irecv: launches every op and returns their works, in
  /// order. The two sides may list their sends and receives in any order.
  std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& p2p_op_list);

  // ---- Objects (c10::IValue: tensors, strings, numbers, lists, dicts, tuples) ------
  // Pickled with LibTorch's pickler (torch::pickle_save), so a tensor inside an object
  // travels with its values and comes back on the device it was saved from.

  /// torch.distributed.broadcast_object_list: every rank's object_list (of one length
  /// everywhere) becomes rank `src`'s.
  void broadcast_object_list(std::vector<c10::IValue>& object_list, int src = 0);
  /// torch.distributed.all_gather_object: object_list (size() entries) receives every
  /// rank's `obj`, in rank order.
  void all_gather_object(std::vector<c10::IValue>& object_list, const c10::IValue& obj);
  /// torch.distributed.gather_object: on `dst`, object_gather_list (size() entries)
  /// receives every rank's `obj`; empty on the other ranks.
  void gather_object(const c10::IValue& obj, std::vector<c10::IValue>& object_gather_list,
                     int dst = 0);
  /// torch.distributed.scatter_object_list: scatter_object_output_list[0] (a list of at
  /// least one entry) receives scatter_object_input_list[rank()] of rank `src` (size()
  /// entries there; ignored elsewhere).
  void scatter_object_list(std::vector<c10::IValue>& scatter_object_output_list,
                           const std::vector<c10::IValue>& scatter_object_input_list, int src = 0);
  /// torch.distributed.send_object_list: to rank `dst`, which receives with
  /// recv_object_list into a list of the same length.
  void send_object_list(const std::vector<c10::IValue>& object_list, int dst);
  /// torch.distributed.recv_object_list: fills object_list from rank `src` (nullopt: any
  /// rank); returns the sender's rank.
  int recv_object_list(std::vector<c10::IValue>& object_list,
                       std::optional<int> src = std::nullopt);

  /// Releases the connections. Further calls throw. Called by the destructor.
  void shutdown();
  bool is_shut_down() const;

 private:
  friend std::shared_ptr<ProcessGroup> detail::make_process_group(
      std::unique_ptr<detail::Comm> comm);
  friend detail::Comm& detail::comm_of(const ProcessGroup& pg);
  friend std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                                 const GroupOptions& options,
                                                 const std::shared_ptr<ProcessGroup>& parent);
  explicit ProcessGroup(std::unique_ptr<detail::Comm> comm);
  detail::Comm& comm() const;
  std::unique_ptr<detail::Comm> comm_;
  std::vector<int> ranks_;  // global ranks, in group rank order
  bool member_ = true;
  int self_ = -1;  // this process's global rank, for a non-member's messages
};

}  // namespace ddp

// The default group's calls, and every collective with a group argument.
#include <ddp/distributed/default_group.h>
