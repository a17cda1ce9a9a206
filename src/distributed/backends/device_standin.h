#pragma once

// Note [Device stand-in]
// ddp-cpp's GPU path must be right on machines that have no GPU: every tensor a
// collective takes on NCCL has to live on this rank's device, and a host tensor that
// reaches one is a crash on the first real GPU. A double that only reports "cuda:r"
// cannot see that mistake, since a host tensor and a "device" tensor are both plain
// CPU tensors to it. So with DDP_DEVICE_STANDIN=1 a real second device type exists:
// LibTorch's PrivateUse1, named "standin", whose memory is host memory. Tensors on it
// are distinct from CPU tensors everywhere LibTorch looks: an op that mixes them fails
// ("Expected all tensors to be on the same device"), model->to(device) moves
// parameters onto it, and the autograd engine runs their backward on a device thread
// of its own, as it does for CUDA. Every ATen op runs through LibTorch's CPU fallback
// (the tensors are copied to the CPU, the op runs there, the results come back),
// which is slow but exact: a stand-in run gives the bits of a CPU run. Events record
// the host clock, so that code timed with device events runs too.
//
// The "standin" backend (standin_comm.cpp) is NCCL's contract over Gloo: collectives
// take only tensors on this rank's stand-in device, and run on host aliases of them.
// It checks placement, not stream order: its waits really wait, as NCCL's do not.
//
// It needs LibTorch 2.1 or newer (the PrivateUse1 hooks); DDP_WITH_STANDIN says
// whether this build has it.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>

namespace ddp {
namespace detail {

/// Whether this build can make the stand-in device (LibTorch 2.1 or newer).
bool standin_supported();

/// Registers the stand-in device, once per process (later calls do nothing). Throws
/// when this LibTorch cannot, or when another PrivateUse1 device is registered. Must
/// run before the process's first backward: the autograd engine counts devices then.
void enable_standin_device();

/// The stand-in device with this index ("standin:<index>").
c10::Device standin_device(int index);

/// A CPU tensor over the same memory as `t`, a tensor on the stand-in device (or
/// `t` itself when it is on the CPU; undefined stays undefined). It keeps `t`'s
/// storage alive.
at::Tensor standin_host_alias(const at::Tensor& t);

class Comm;
/// The "standin" backend (standin_comm.cpp): `host` (a Gloo group, or LocalComm at
/// world size 1) behind NCCL's rules on the stand-in device of this rank's local rank.
std::unique_ptr<Comm> make_standin_comm(std::unique_ptr<Comm> host);

}  // namespace detail
}  // namespace ddp
