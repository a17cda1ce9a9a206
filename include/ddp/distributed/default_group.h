#pragma once

// The default group, as in torch.distributed: init_process_group, the rank queries and
// the collectives on the group that init_process_group made.
//
// Example:
//   ddp::init_process_group(ddp::InitOptions().backend("gloo"));   // reads the env
//   torch::Tensor t = torch::ones({4}) * ddp::get_rank();
//   ddp::all_reduce(t, ddp::ReduceOp::AVG);
//   ddp::destroy_process_group();

#include <ddp/distributed/options.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

class ProcessGroup;

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
int get_local_rank();
int get_local_world_size();
/// The device to move the model to (lesson step 4): cuda:local_rank under "nccl".
c10::Device get_device();

void barrier();
/// ProcessGroup::monitored_barrier on the default group, with its timeout.
void monitored_barrier();
/// ProcessGroup::monitored_barrier on the default group.
void monitored_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks = true);
void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM);
void broadcast(at::Tensor& tensor, int src = 0);
std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
std::vector<std::string> all_gather_bytes(const std::string& bytes);
void reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                           ReduceOp op = ReduceOp::SUM);
void all_gather_into_tensor(at::Tensor& output, const at::Tensor& input);

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
