#include "formats/rng_state.h"
#include "distributed/common/check.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace ddp {
namespace detail {

namespace {

int cuda_device_count() {
  return at::globalContext().hasCUDA() ? at::detail::getCUDAHooks().getNumGPUs() : 0;
}

at::Generator cuda_generator(int index) {
  return at::globalContext().defaultGenerator(
      c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)));
}

at::Tensor state_of(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state().clone();
}

void set_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

void check_state(const at::Tensor& saved, const at::Tensor& current, const std::string& what,
                 const std::string& where) {
  DDP_CHECK(saved.scalar_type() == at::kByte && saved.dim() == 1 &&
                saved.numel() == current.numel(),
            where, ": ", what, " should be a uint8 tensor of ", current.numel(),
            " bytes (a generator state), but is ", saved.scalar_type(), " of shape ",
            shape_string(saved),
            ". Save with Checkpoint::rng(true), or load with "
            "Checkpoint::rng(false) to keep the current RNG state.");
}

}  // namespace

c10::impl::GenericDict rng_state() {
  c10::impl::GenericDict out = new_dict();
  out.insert("cpu", state_of(at::detail::getDefaultCPUGenerator()));
  c10::impl::GenericList cuda = new_list();
  for (int i = 0; i < cuda_device_count(); ++i) cuda.push_back(state_of(cuda_generator(i)));
  out.insert("cuda", cuda);
  return out;
}

Apply prepare_rng_load(const c10::IValue& saved, const std::string& what,
                       const std::string& where) {
  const c10::impl::GenericDict dict = as_dict(saved, what, where);
  const at::Tensor cpu = get_tensor(dict, "cpu", what, where).contiguous();
  check_state(cpu, state_of(at::detail::getDefaultCPUGenerator()), what + "['cpu']", where);
  const c10::IValue cuda_value = get(dict, "cuda", what, where);
  DDP_CHECK(cuda_value.isList(), where, ": ", what, "['cuda'] should be a list");
  const c10::impl::GenericList cuda_list = cuda_value.toList();
  std::vector<at::Tensor> cuda;
  const int devices = std::min<int>(cuda_device_count(), static_cast<int>(cuda_list.size()));
  for (int i = 0; i < devices; ++i) {
    const std::string name = what + "['cuda'][" + std::to_string(i) + "]";
    DDP_CHECK(cuda_list.get(i).isTensor(), where, ": ", name, " should be a tensor");
    cuda.push_back(cuda_list.get(i).toTensor().contiguous());
    check_state(cuda.back(), state_of(cuda_generator(i)), name, where);
  }
  return [cpu, cuda] {
    set_state(at::detail::getDefaultCPUGenerator(), cpu);
    for (size_t i = 0; i < cuda.size(); ++i)
      set_state(cuda_generator(static_cast<int>(i)), cuda[i]);
  };
}

}  // namespace detail
}  // namespace ddp
