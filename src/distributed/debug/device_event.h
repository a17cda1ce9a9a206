#pragma once

// Note [Device time]
// On a GPU, a collective's future completes when its kernel is queued (NCCL marks it
// complete at launch, with CUDA events attached), and a host wait returns once the
// current stream is made to wait. The host clock therefore says nothing about when a
// reduction ended. Whatever ddp-cpp reports about that (DDP's per-bucket times and
// "done before the end of backward", the flight recorder's completed entries) comes
// from events recorded on the device's streams instead: one when the bucket is
// launched, on the stream that computed its gradients, and one in the future's
// callback, which runs with the current stream already waiting for the collective.
// On the CPU the host clock is the truth, and no event is made.

#include <c10/core/Device.h>

#include <memory>

namespace c10 {
struct Event;
}

namespace ddp {
namespace detail {

class DeviceEvent {
 public:
  /// An event recorded now on `device`'s current stream; nullptr on the CPU, and in a
  /// build without device events (LibTorch without CUDA and without the stand-in).
  static std::shared_ptr<DeviceEvent> record(const c10::Device& device);
  ~DeviceEvent();
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;

  /// Whether the work queued before it has finished. Never blocks.
  bool done() const;
  /// Blocks until done().
  void synchronize() const;
  /// Milliseconds from `start` to this event; both must be done.
  double ms_since(const DeviceEvent& start) const;

 private:
  explicit DeviceEvent(const c10::Device& device);
  std::unique_ptr<c10::Event> event_;
};

}  // namespace detail
}  // namespace ddp
