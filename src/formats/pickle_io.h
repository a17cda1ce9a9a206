#pragma once

// Pickled IValues (the format of Python's torch.save / torch.load) and checked access to
// the dicts inside them. `where` prefixes every error, e.g. "load_checkpoint('a.pt')".

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <string>
#include <vector>

namespace ddp {
namespace detail {

/// A change to apply once everything has been validated (Note [Validate, then apply]).
using Apply = std::function<void()>;

/// torch.save's zipfile format, readable by torch.load in Python.
std::vector<char> pickle(const c10::IValue& value);
/// pickle() as a string, for collectives that move bytes (all_gather_bytes, ...).
std::string pickle_string(const c10::IValue& value);
/// Reads what pickle() or Python's torch.save (zipfile format) wrote. A truncated or
/// corrupt file throws, naming `where` and the size.
c10::IValue unpickle(const std::string& bytes, const std::string& where);
/// The same, taking the bytes over (no copy of them).
c10::IValue unpickle(std::vector<char>&& bytes, const std::string& where);

/// An empty dict with string keys, as Python's dict[str, Any].
c10::impl::GenericDict new_dict();
c10::impl::GenericList new_list();

/// `value` as a dict; throws naming `what` otherwise.
c10::impl::GenericDict as_dict(const c10::IValue& value, const std::string& what,
                               const std::string& where);
/// dict[key]; throws naming the key and `what` (the dict's own name) when missing.
c10::IValue get(const c10::impl::GenericDict& dict, const std::string& key, const std::string& what,
                const std::string& where);
int64_t get_int(const c10::impl::GenericDict& dict, const std::string& key, const std::string& what,
                const std::string& where);
std::vector<int64_t> get_int_list(const c10::impl::GenericDict& dict, const std::string& key,
                                  const std::string& what, const std::string& where);
double get_double(const c10::impl::GenericDict& dict, const std::string& key,
                  const std::string& what, const std::string& where);
bool get_bool(const c10::impl::GenericDict& dict, const std::string& key, const std::string& what,
              const std::string& where);
at::Tensor get_tensor(const c10::impl::GenericDict& dict, const std::string& key,
                      const std::string& what, const std::string& where);

/// A dict of str -> Tensor (Python's state dict, an OrderedDict, arrives untyped).
c10::Dict<std::string, at::Tensor> tensor_dict(const c10::IValue& value, const std::string& what,
                                               const std::string& where);

/// `tensor` on the CPU, detached, owning exactly its own bytes: the tensor itself when it
/// already is (pickling happens at once, so no copy is needed), else a copy.
at::Tensor cpu_copy(const at::Tensor& tensor);

/// "[2, 3]".
std::string shape_string(const at::Tensor& tensor);

}  // namespace detail
}  // namespace ddp
