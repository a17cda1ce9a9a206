#include <ddp/modules/output_tensors.h>

namespace ddp {
namespace detail {

void collect_ivalue_tensors(const c10::IValue& value, std::vector<at::Tensor>& out) {
  if (value.isTensor()) {
    if (value.toTensor().defined()) out.push_back(value.toTensor());
  } else if (value.isTensorList()) {
    for (const auto& t : value.toTensorVector()) {
      if (t.defined()) out.push_back(t);
    }
  } else if (value.isList()) {
    for (const auto& v : value.toListRef()) collect_ivalue_tensors(v, out);
  } else if (value.isTuple()) {
    for (const auto& v : value.toTupleRef().elements()) collect_ivalue_tensors(v, out);
  } else if (value.isGenericDict()) {
    for (const auto& kv : value.toGenericDict()) collect_ivalue_tensors(kv.value(), out);
  }
}

}  // namespace detail
}  // namespace ddp
