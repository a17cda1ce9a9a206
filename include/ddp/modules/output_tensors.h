#pragma once

// How DistributedDataParallel finds the tensors in whatever forward() returned, to walk
// the autograd graph from them (find_unused_parameters). Tensors, std::vector, std::
// tuple, std::pair, std::optional and c10::IValue (lists, tuples, dicts) are known; for
// your own output type, specialise ddp::OutputTensors:
//
//   template <>
//   struct ddp::OutputTensors<MyOutput> {
//     static constexpr bool known = true;
//     static void collect(const MyOutput& o, std::vector<at::Tensor>& out) {
//       out.push_back(o.logits);
//       out.push_back(o.aux_loss);
//     }
//   };

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <optional>

#include <cstddef>
#include <tuple>
#include <utility>
#include <vector>

namespace ddp {

/// Collects the tensors of a forward output of type T. `known` is false for types DDP
/// cannot search; find_unused_parameters then refuses them with an error naming T.
template <typename T, typename = void>
struct OutputTensors {
  static constexpr bool known = false;
  static void collect(const T&, std::vector<at::Tensor>&) {}
};

template <>
struct OutputTensors<at::Tensor> {
  static constexpr bool known = true;
  static void collect(const at::Tensor& t, std::vector<at::Tensor>& out) {
    if (t.defined()) out.push_back(t);
  }
};

namespace detail {
void collect_ivalue_tensors(const c10::IValue& value, std::vector<at::Tensor>& out);
}  // namespace detail

template <>
struct OutputTensors<c10::IValue> {
  static constexpr bool known = true;
  static void collect(const c10::IValue& v, std::vector<at::Tensor>& out) {
    detail::collect_ivalue_tensors(v, out);
  }
};

template <typename T>
struct OutputTensors<std::vector<T>> {
  static constexpr bool known = OutputTensors<T>::known;
  static void collect(const std::vector<T>& v, std::vector<at::Tensor>& out) {
    for (const auto& x : v) OutputTensors<T>::collect(x, out);
  }
};

template <typename T>
struct OutputTensors<std::optional<T>> {
  static constexpr bool known = OutputTensors<T>::known;
  static void collect(const std::optional<T>& v, std::vector<at::Tensor>& out) {
    if (v) OutputTensors<T>::collect(*v, out);
  }
};

template <typename A, typename B>
struct OutputTensors<std::pair<A, B>> {
  static constexpr bool known = OutputTensors<A>::known && OutputTensors<B>::known;
  static void collect(const std::pair<A, B>& v, std::vector<at::Tensor>& out) {
    OutputTensors<A>::collect(v.first, out);
    OutputTensors<B>::collect(v.second, out);
  }
};

template <typename... Ts>
struct OutputTensors<std::tuple<Ts...>> {
  static constexpr bool known = (OutputTensors<Ts>::known && ... && true);
  static void collect(const std::tuple<Ts...>& v, std::vector<at::Tensor>& out) {
    collect_each(v, out, std::index_sequence_for<Ts...>{});
  }

 private:
  template <std::size_t... I>
  static void collect_each(const std::tuple<Ts...>& v, std::vector<at::Tensor>& out,
                           std::index_sequence<I...>) {
    (OutputTensors<std::tuple_element_t<I, std::tuple<Ts...>>>::collect(std::get<I>(v), out), ...);
  }
};

}  // namespace ddp
