// Model state dicts with Python's keys and order.

#include <ddp/serialize/checkpoint.h>

#include "formats/atomic_file.h"
#include "distributed/common/check.h"
#include "formats/pickle_io.h"
#include "serialize/state_dict.h"

#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <sstream>
#include <vector>

namespace ddp {

namespace {

// Note [State dict order]
// Python's Module.state_dict() visits a module's own parameters, then its own buffers,
// then each child in registration order, prefixing "child.". LibTorch's
// named_parameters()/named_buffers() list all parameters before any buffer, so the
// dict is built recursively here to get Python's order as well as its keys. Undefined
// tensors (e.g. Linear's bias with bias=false) are skipped, as Python skips None.
void collect(const torch::nn::Module& module, const std::string& prefix,
             c10::Dict<std::string, at::Tensor>& out) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    if (p.value().defined()) out.insert(prefix + p.key(), p.value().detach());
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    if (b.value().defined()) out.insert(prefix + b.key(), b.value().detach());
  }
  for (const auto& child : module.named_children()) {
    collect(*child.value(), prefix + child.key() + ".", out);
  }
}

std::string list_keys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 10;
  std::ostringstream os;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) {
    os << (i ? ", " : "") << "'" << keys[i] << "'";
  }
  if (keys.size() > kShown) os << " and " << keys.size() - kShown << " more";
  return os.str();
}

}  // namespace

c10::Dict<std::string, at::Tensor> model_state_dict(const torch::nn::Module& model) {
  c10::Dict<std::string, at::Tensor> out;
  collect(model, "", out);
  return out;
}

namespace detail {

c10::Dict<std::string, at::Tensor> cpu_state_dict(const torch::nn::Module& model) {
  c10::Dict<std::string, at::Tensor> out;
  for (const auto& entry : model_state_dict(model)) {
    out.insert(entry.key(), cpu_copy(entry.value()));
  }
  return out;
}

// Note [Validate, then apply]
// Loading checks everything (keys, shapes, optimizer layout, sampler compatibility, RNG
// sizes) and only then changes anything, so a bad file leaves the model, optimizer,
// sampler and RNG exactly as they were. Each part returns an Apply closure that cannot
// fail for a reason the checks could have caught.
Apply prepare_model_load(torch::nn::Module& model, const c10::Dict<std::string, at::Tensor>& state,
                         const std::string& where) {
  const c10::Dict<std::string, at::Tensor> mine = model_state_dict(model);
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& entry : mine) {
    const auto it = state.find(entry.key());
    if (it == state.end()) {
      missing.push_back(entry.key());
    } else if (it->value().sizes() != entry.value().sizes()) {
      mismatched.push_back("'" + entry.key() + "': the checkpoint has shape " +
                           shape_string(it->value()) + ", the model has " +
                           shape_string(entry.value()));
    }
  }
  for (const auto& entry : state) {
    if (!mine.contains(entry.key())) unexpected.push_back(entry.key());
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::ostringstream os;
    os << where << ": the state dict does not fit the model (nothing was loaded).";
    if (!missing.empty()) {
      os << " Missing key(s) that the model has: " << list_keys(missing) << ".";
    }
    if (!unexpected.empty()) {
      os << " Unexpected key(s) that the model does not have: " << list_keys(unexpected) << ".";
    }
    for (const auto& m : mismatched) os << " Size mismatch for " << m << ".";
    os << " Expected the state dict of the same architecture (keys as Python's "
          "module.state_dict(), e.g. 'conv1.weight').";
    DDP_CHECK(false, os.str());
  }
  return [mine, state] {
    torch::NoGradGuard no_grad;
    for (const auto& entry : mine) {
      at::Tensor target = entry.value();
      target.copy_(state.at(entry.key()));
    }
  };
}

}  // namespace detail

void load_model_state_dict(torch::nn::Module& model,
                           const c10::Dict<std::string, at::Tensor>& state) {
  detail::prepare_model_load(model, state, "load_model_state_dict")();
}

c10::Dict<std::string, at::Tensor> read_state_dict(const std::string& path) {
  const std::string where = "read_state_dict('" + path + "')";
  DDP_CHECK(detail::file_exists(path), where, ": no such file");
  const c10::IValue value = detail::unpickle(detail::read_file(path), where);
  if (value.isGenericDict()) {
    const c10::impl::GenericDict dict = value.toGenericDict();
    const auto format = dict.find("format");
    if (format != dict.end() && format->value().isString() &&
        format->value().toStringRef() == "ddp-cpp checkpoint") {
      return detail::tensor_dict(detail::get(dict, "model", "the checkpoint", where),
                                 "the checkpoint's 'model'", where);
    }
  }
  return detail::tensor_dict(value, "the state dict", where);
}

void save_state_dict(const c10::Dict<std::string, at::Tensor>& state, const std::string& path) {
  c10::Dict<std::string, at::Tensor> cpu;
  for (const auto& kv : state) cpu.insert(kv.key(), kv.value().detach().cpu());
  const std::vector<char> bytes = detail::pickle(c10::IValue(cpu));
  detail::write_file_atomic(path, std::string_view(bytes.data(), bytes.size()));
}

void save_model_state_dict(const torch::nn::Module& model, const std::string& path) {
  const std::vector<char> bytes = detail::pickle(c10::IValue(detail::cpu_state_dict(model)));
  detail::write_file_atomic(path, std::string_view(bytes.data(), bytes.size()));
}

}  // namespace ddp
