#include "distributed/debug/device_event.h"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace ddp {
namespace detail {

#if defined(DDP_WITH_CUDA) || defined(DDP_WITH_STANDIN)
// LibTorch 2.x: events that time (BACKEND_DEFAULT: CUDA's default flags; PyTorch's own
// default disables timing).
std::shared_ptr<DeviceEvent> DeviceEvent::record(const c10::Device& device) {
  if (device.is_cpu()) return nullptr;
  return std::shared_ptr<DeviceEvent>(new DeviceEvent(device));
}

DeviceEvent::DeviceEvent(const c10::Device& device)
    : event_(std::make_unique<c10::Event>(device.type(), c10::EventFlag::BACKEND_DEFAULT)) {
  c10::impl::VirtualGuardImpl impl(device.type());
  event_->record(impl.getStream(device));
}

bool DeviceEvent::done() const { return event_->query(); }
void DeviceEvent::synchronize() const { event_->synchronize(); }
double DeviceEvent::ms_since(const DeviceEvent& start) const {
  return start.event_->elapsedTime(*event_);
}
#else
std::shared_ptr<DeviceEvent> DeviceEvent::record(const c10::Device&) { return nullptr; }
DeviceEvent::DeviceEvent(const c10::Device&) {}
bool DeviceEvent::done() const { return true; }
void DeviceEvent::synchronize() const {}
double DeviceEvent::ms_since(const DeviceEvent&) const { return 0; }
#endif

DeviceEvent::~DeviceEvent() = default;

}  // namespace detail
}  // namespace ddp
