// The stand-in device: Note [Device stand-in] in device_standin.h.
//
// What LibTorch needs of a PrivateUse1 device, and nothing more: an allocator (host
// memory, tagged with the stand-in device), a device guard (current device, one
// default stream, events that record the host clock), the hooks interface, the handful
// of ops that cannot go through the CPU fallback (tensor creation, copies, views,
// resizing, convolution), and the CPU fallback for every other op. All of it is
// registered at run time by enable_standin_device(), never by static initialisers, so
// a program that does not ask for the stand-in is not touched by it.

#include "distributed/backends/device_standin.h"

#include "distributed/common/check.h"

#include <ATen/ATen.h>

#ifdef DDP_WITH_STANDIN
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>
#endif

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>

namespace ddp {
namespace detail {

#ifdef DDP_WITH_STANDIN
namespace {

constexpr c10::DeviceType kStandin = c10::DeviceType::PrivateUse1;
// Enough for every local rank of one host in tests; the autograd engine starts one
// thread per device it is told of.
constexpr c10::DeviceIndex kDevices = 16;

thread_local c10::DeviceIndex current_device = 0;

class StandinAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    void* data = bytes == 0 ? nullptr : c10::alloc_cpu(bytes);
    return {data, data, &c10::free_cpu, c10::Device(kStandin, current_device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &c10::free_cpu; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

StandinAllocator& allocator() {
  static StandinAllocator a;
  return a;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One default stream per device; work is synchronous, so events complete when
// recorded and hold the host time they were recorded at.
class StandinGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kStandin; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    current_device = d.index();
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kStandin, current_device); }
  void setDevice(c10::Device d) const override { current_device = d.index(); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { current_device = d.index(); }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kDevices; }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr) *event = new int64_t(0);
    *static_cast<int64_t*>(*event) = now_ns();
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<int64_t*>(event);
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  // Not marked override: older LibTorch has no elapsedTime.
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const {
    return static_cast<double>(*static_cast<int64_t*>(end) - *static_cast<int64_t*>(start)) / 1e6;
  }
};

class StandinHooks final : public at::PrivateUse1HooksInterface {
 public:
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  // Random numbers come from the CPU generator, as the CPU fallback draws them there.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Device getDeviceFromPtr(void*) const override { return at::Device(kStandin, current_device); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
};

// ---- Ops that the CPU fallback cannot do ---------------------------------------------

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout>, std::optional<c10::Device> device,
                               std::optional<bool>, std::optional<c10::MemoryFormat> format) {
  c10::DeviceGuard guard(c10::device_or_default(device));
  constexpr c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  return at::detail::empty_generic(size, &allocator(), keys, c10::dtype_or_default(dtype), format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                         std::optional<c10::Device> device, std::optional<bool>) {
  c10::DeviceGuard guard(c10::device_or_default(device));
  constexpr c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  return at::detail::empty_strided_generic(size, stride, &allocator(), keys,
                                           c10::dtype_or_default(dtype));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  at::Tensor to = standin_host_alias(dst);
  to.copy_(standin_host_alias(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage storage, int64_t offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::cpu::set_(self, storage, offset, size, stride);
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<c10::MemoryFormat> format) {
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), format);
}

bool compatible_shallow_copy(const at::Tensor& a, const at::Tensor& b) {
  // model->to(device) swaps a parameter's data between the CPU and the stand-in.
  const auto ok = [](const at::Tensor& t) { return t.is_cpu() || t.device().type() == kStandin; };
  return ok(a) && ok(b);
}

at::Tensor back_on(const at::Tensor& t, const at::Device& device) {
  return t.defined() ? t.to(device) : t;
}

// ATen sends convolutions on an unknown device to these two instead of its fallback.
at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  std::optional<at::Tensor> host_bias;
  if (bias && bias->defined()) host_bias = bias->cpu();
  return at::convolution(input.cpu(), weight.cpu(), host_bias, stride, padding, dilation,
                         transposed, output_padding, groups)
      .to(input.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> mask) {
  auto grads =
      at::convolution_backward(grad_output.cpu(), input.cpu(), weight.cpu(),
                               std::vector<int64_t>{weight.size(transposed ? 1 : 0)}, stride,
                               padding, dilation, transposed, output_padding, groups, mask);
  const at::Device d = input.device();
  return {back_on(std::get<0>(grads), d), back_on(std::get<1>(grads), d),
          back_on(std::get<2>(grads), d)};
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::native::cpu_fallback(op, stack);
}

void register_everything() {
  const std::string name = c10::get_privateuse1_backend();
  DDP_CHECK(name == "privateuseone" || name == "standin",
            "DDP_DEVICE_STANDIN: the device stand-in uses LibTorch's PrivateUse1 device, but "
            "this process already registered it as \"",
            name, "\". Unset DDP_DEVICE_STANDIN in a program with its own PrivateUse1 device.");
  if (name != "standin") c10::register_privateuse1_backend("standin");
  static StandinGuard guard;
  static c10::impl::DeviceGuardImplRegistrar guard_registrar(kStandin, &guard);
  static StandinHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  static torch::Library ops(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                            __LINE__);
  ops.impl("empty.memory_format", empty_memory_format);
  ops.impl("empty_strided", empty_strided);
  ops.impl("_copy_from", copy_from);
  ops.impl("_copy_from_and_resize", copy_from_and_resize);
  ops.impl("as_strided", at::native::as_strided_tensorimpl);
  ops.impl("view", at::native::view);
  ops.impl("_reshape_alias", at::native::_reshape_alias);
  ops.impl("set_.source_Storage_storage_offset", set_storage);
  ops.impl("resize_", resize);
  ops.impl("_has_compatible_shallow_copy_type", compatible_shallow_copy);
  ops.impl("convolution_overrideable", convolution);
  ops.impl("convolution_backward_overrideable", convolution_backward);
  static torch::Library fallback(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__,
                                 __LINE__);
  fallback.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

}  // namespace

bool standin_supported() { return true; }

void enable_standin_device() {
  static std::once_flag once;
  std::call_once(once, register_everything);
}

c10::Device standin_device(int index) {
  DDP_CHECK(index >= 0 && index < kDevices, "the device stand-in has devices 0..", kDevices - 1,
            ", but local rank ", index, " asked for one. Start at most ", int(kDevices),
            " processes per host under DDP_DEVICE_STANDIN.");
  return c10::Device(kStandin, static_cast<c10::DeviceIndex>(index));
}

#else  // !DDP_WITH_STANDIN

bool standin_supported() { return false; }

void enable_standin_device() {
  DDP_CHECK(false,
            "DDP_DEVICE_STANDIN needs LibTorch 2.1 or newer (its PrivateUse1 device hooks); "
            "this ddp-cpp was built against an older one. Unset DDP_DEVICE_STANDIN, or build "
            "against pip torch (scripts/build).");
}

c10::Device standin_device(int) {
  enable_standin_device();  // throws
  return c10::Device(c10::DeviceType::CPU);
}

#endif  // DDP_WITH_STANDIN

at::Tensor standin_host_alias(const at::Tensor& t) {
  if (!t.defined() || t.is_cpu()) return t;
  // The alias holds the storage, so the memory outlives any collective that uses it.
  c10::Storage storage = t.storage();
  return at::from_blob(
      t.data_ptr(), t.sizes(), t.strides(), [storage](void*) {},
      t.options().device(c10::Device(c10::DeviceType::CPU)));
}

}  // namespace detail
}  // namespace ddp
