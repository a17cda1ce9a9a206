#pragma once

// The default group, as in torch.distributed: init_process_group, the rank queries and
// the collectives on the group that init_process_group made.
//
// Example:
//   ddp::init_process_group(ddp::InitOptions().backend("gloo"));   // reads the env
//   torch::Tensor t = torch::ones({4}) * ddp::get_rank();
//   ddp::all_reduce(t, ddp::ReduceOp::AVG);
//   ddp::destroy_process_group();

#include <ddp/distributed/process_group.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

/// Whether this build has the "nccl" backend (LibTorch with CUDA and NCCL).
bool is_nccl_available();
/// Always true: Gloo is part of every LibTorch with c10d.
bool is_gloo_available();

/// Joins the default group. Throws if it is already initialised.
void init_process_group(const InitOptions& options = InitOptions());
bool is_initialized();
/// Releases the default group. Throws if none is initialised.
void destroy_process_group();
/// The default group. Throws if none is initialised.
std::shared_ptr<ProcessGroup> default_group();

int get_rank();
int get_world_size();
/// torch.distributed.get_rank(group): this process's rank within `group` (the default
/// group when null), -1 when it is not a member.
int get_rank(const std::shared_ptr<ProcessGroup>& group);
/// torch.distributed.get_world_size(group): `group`'s size (the default group when
/// null), -1 on a rank that is not a member.
int get_world_size(const std::shared_ptr<ProcessGroup>& group);
int get_local_rank();
int get_local_world_size();
/// The device to move the model to (lesson step 4): cuda:local_rank under "nccl".
c10::Device get_device();

/// The collectives below run on `group`, or on the default group when it is null
/// (Python's group=None). Note [Free functions take global ranks]: a `src`, `dst` or
/// P2POp peer is a global rank (a rank of the default group), as in torch.distributed,
/// also with a group; recv and recv_object_list return the sender's global rank. The
/// ProcessGroup methods of the same names take ranks within the group, as c10d's do.
void barrier(const std::shared_ptr<ProcessGroup>& group = nullptr);
/// ProcessGroup::monitored_barrier on the default group, with its timeout.
void monitored_barrier();
/// ProcessGroup::monitored_barrier on the default group.
void monitored_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks = true);
void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM,
                const std::shared_ptr<ProcessGroup>& group = nullptr);
Work all_reduce_async(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM,
                      const std::shared_ptr<ProcessGroup>& group = nullptr);
void broadcast(at::Tensor& tensor, int src = 0,
               const std::shared_ptr<ProcessGroup>& group = nullptr);
Work broadcast_async(at::Tensor& tensor, int src = 0,
                     const std::shared_ptr<ProcessGroup>& group = nullptr);
std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
std::vector<std::string> all_gather_bytes(const std::string& bytes);
void reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::SUM,
                           const std::shared_ptr<ProcessGroup>& group = nullptr);
void all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                            const std::shared_ptr<ProcessGroup>& group = nullptr);
void reduce(at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::SUM,
            const std::shared_ptr<ProcessGroup>& group = nullptr);
Work reduce_async(at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::SUM,
                  const std::shared_ptr<ProcessGroup>& group = nullptr);
void gather(const at::Tensor& tensor, std::vector<at::Tensor>& gather_list, int dst = 0,
            const std::shared_ptr<ProcessGroup>& group = nullptr);
Work gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& gather_list, int dst = 0,
                  const std::shared_ptr<ProcessGroup>& group = nullptr);
void scatter(at::Tensor& tensor, const std::vector<at::Tensor>& scatter_list, int src = 0,
             const std::shared_ptr<ProcessGroup>& group = nullptr);
Work scatter_async(at::Tensor& tensor, const std::vector<at::Tensor>& scatter_list, int src = 0,
                   const std::shared_ptr<ProcessGroup>& group = nullptr);
void reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& input_list,
                    ReduceOp op = ReduceOp::SUM,
                    const std::shared_ptr<ProcessGroup>& group = nullptr);
Work reduce_scatter_async(at::Tensor& output, const std::vector<at::Tensor>& input_list,
                          ReduceOp op = ReduceOp::SUM,
                          const std::shared_ptr<ProcessGroup>& group = nullptr);
void all_gather(std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor,
                const std::shared_ptr<ProcessGroup>& group = nullptr);
Work all_gather_async(std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor,
                      const std::shared_ptr<ProcessGroup>& group = nullptr);
void all_to_all(std::vector<at::Tensor>& output_list, const std::vector<at::Tensor>& input_list,
                const std::shared_ptr<ProcessGroup>& group = nullptr);
Work all_to_all_async(std::vector<at::Tensor>& output_list,
                      const std::vector<at::Tensor>& input_list,
                      const std::shared_ptr<ProcessGroup>& group = nullptr);
void all_to_all_single(at::Tensor& output, const at::Tensor& input,
                       const std::vector<int64_t>& output_split_sizes = {},
                       const std::vector<int64_t>& input_split_sizes = {},
                       const std::shared_ptr<ProcessGroup>& group = nullptr);
Work all_to_all_single_async(at::Tensor& output, const at::Tensor& input,
                             const std::vector<int64_t>& output_split_sizes = {},
                             const std::vector<int64_t>& input_split_sizes = {},
                             const std::shared_ptr<ProcessGroup>& group = nullptr);

void send(const at::Tensor& tensor, int dst, int tag = 0,
          const std::shared_ptr<ProcessGroup>& group = nullptr);
int recv(at::Tensor& tensor, std::optional<int> src = std::nullopt, int tag = 0,
         const std::shared_ptr<ProcessGroup>& group = nullptr);
Work isend(const at::Tensor& tensor, int dst, int tag = 0,
           const std::shared_ptr<ProcessGroup>& group = nullptr);
Work irecv(at::Tensor& tensor, std::optional<int> src = std::nullopt, int tag = 0,
           const std::shared_ptr<ProcessGroup>& group = nullptr);
std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& p2p_op_list,
                                    const std::shared_ptr<ProcessGroup>& group = nullptr);

void broadcast_object_list(std::vector<c10::IValue>& object_list, int src = 0,
                           const std::shared_ptr<ProcessGroup>& group = nullptr);
void all_gather_object(std::vector<c10::IValue>& object_list, const c10::IValue& obj,
                       const std::shared_ptr<ProcessGroup>& group = nullptr);
void gather_object(const c10::IValue& obj, std::vector<c10::IValue>& object_gather_list,
                   int dst = 0, const std::shared_ptr<ProcessGroup>& group = nullptr);
void scatter_object_list(std::vector<c10::IValue>& scatter_object_output_list,
                         const std::vector<c10::IValue>& scatter_object_input_list, int src = 0,
                         const std::shared_ptr<ProcessGroup>& group = nullptr);
void send_object_list(const std::vector<c10::IValue>& object_list, int dst,
                      const std::shared_ptr<ProcessGroup>& group = nullptr);
int recv_object_list(std::vector<c10::IValue>& object_list, std::optional<int> src = std::nullopt,
                     const std::shared_ptr<ProcessGroup>& group = nullptr);

/// Initialises the default group on construction and destroys it at scope exit, also
/// when an exception unwinds, so no peer is left waiting for a rank that is gone.
class ProcessGroupGuard {
 public:
  explicit ProcessGroupGuard(const InitOptions& options = InitOptions());
  ~ProcessGroupGuard();
  ProcessGroupGuard(const ProcessGroupGuard&) = delete;
  ProcessGroupGuard& operator=(const ProcessGroupGuard&) = delete;
};

}  // namespace ddp
