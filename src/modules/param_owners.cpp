#include "modules/param_owners.h"

#include <c10/util/intrusive_ptr.h>

#include <mutex>
#include <unordered_map>

namespace ddp {
namespace detail {
namespace {

std::mutex& owners_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<const void*, ShardOwner*>& owners() {
  static std::unordered_map<const void*, ShardOwner*> map;
  return map;
}

// DistributedDataParallel's parameters: a count per tensor, with a weak reference, so
// that an entry outliving its tensor (a DDP whose constructor threw after marking) is
// never taken for a new tensor at the same address.
struct DdpMark {
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  int count = 0;
};
std::unordered_map<const void*, DdpMark>& ddp_params() {
  static std::unordered_map<const void*, DdpMark> map;
  return map;
}
bool same_tensor(const DdpMark& mark, const at::Tensor& t) {
  auto alive = mark.tensor.lock();
  return alive && alive.get() == t.unsafeGetTensorImpl();
}

}  // namespace

ShardOwner* shard_owner_of(const at::Tensor& param) {
  if (!param.defined()) return nullptr;
  std::lock_guard<std::mutex> lock(owners_mutex());
  auto it = owners().find(param.unsafeGetTensorImpl());
  return it == owners().end() ? nullptr : it->second;
}

void register_shard_owner(const at::Tensor& param, ShardOwner* owner) {
  std::lock_guard<std::mutex> lock(owners_mutex());
  owners()[param.unsafeGetTensorImpl()] = owner;
}

void unregister_shard_owner(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(owners_mutex());
  auto it = owners().find(param.unsafeGetTensorImpl());
  if (it != owners().end()) owners().erase(it);
}

void mark_ddp_param(const at::Tensor& param, bool owned) {
  std::lock_guard<std::mutex> lock(owners_mutex());
  auto& m = ddp_params();
  auto it = m.find(param.unsafeGetTensorImpl());
  if (it != m.end() && !same_tensor(it->second, param)) {
    m.erase(it);
    it = m.end();
  }
  if (owned) {
    if (it == m.end()) {
      it = m.emplace(param.unsafeGetTensorImpl(),
                     DdpMark{c10::weak_intrusive_ptr<c10::TensorImpl>(param.getIntrusivePtr()), 0})
               .first;
    }
    it->second.count += 1;
  } else if (it != m.end() && --it->second.count <= 0) {
    m.erase(it);
  }
}

bool is_ddp_param(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(owners_mutex());
  auto& m = ddp_params();
  auto it = m.find(param.unsafeGetTensorImpl());
  if (it == m.end()) return false;
  if (same_tensor(it->second, param)) return true;
  m.erase(it);
  return false;
}

}  // namespace detail
}  // namespace ddp
