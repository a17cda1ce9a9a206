#include "parallel/bucket.h"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>

namespace ddp {
namespace detail {

at::Tensor plain_view(const at::Tensor& buffer, int64_t offset, at::IntArrayRef sizes) {
  // See Note [Plain bucket views].
  at::AutoDispatchBelowADInplaceOrView guard;
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  return buffer.narrow(/*dim=*/0, offset, numel).view(sizes);
}

at::Tensor bucket_view(const at::Tensor& buffer, int64_t offset, const at::Tensor& param) {
  if (param.is_contiguous() || !param.is_non_overlapping_and_dense()) {
    return plain_view(buffer, offset, param.sizes());
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return buffer.as_strided(param.sizes(), param.strides(), buffer.storage_offset() + offset);
}

std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& params,
                                 const BucketAssignment& assignment,
                                 const BufferAllocator& allocate) {
  std::vector<Bucket> buckets(assignment.size());
  std::vector<int64_t> numels;
  std::vector<at::TensorOptions> options;
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket& bucket = buckets[b];
    bucket.params = assignment[b];
    int64_t total = 0;
    for (size_t i : bucket.params) {
      bucket.offsets.push_back(total);
      total += params[i].numel();
    }
    bucket.pending = bucket.params.size();
    bucket.numel = total;
    bucket.options = params[bucket.params.front()].options().requires_grad(false);
    numels.push_back(total);
    options.push_back(bucket.options);
  }
  if (!allocate) return buckets;
  std::vector<at::Tensor> buffers = allocate(numels, options);
  for (size_t b = 0; b < buckets.size(); ++b) {
    buckets[b].buffer = std::move(buffers[b]);
    if (buckets[b].buffer.defined()) make_views(buckets[b], params);
  }
  return buckets;
}

void make_views(Bucket& bucket, const std::vector<at::Tensor>& params) {
  bucket.views.clear();
  for (size_t k = 0; k < bucket.params.size(); ++k) {
    bucket.views.push_back(bucket_view(bucket.buffer, bucket.offsets[k], params[bucket.params[k]]));
  }
}

std::vector<Slot> locate_params(const BucketAssignment& assignment, size_t num_params) {
  std::vector<Slot> slots(num_params);
  for (size_t b = 0; b < assignment.size(); ++b) {
    for (size_t k = 0; k < assignment[b].size(); ++k) slots[assignment[b][k]] = Slot{b, k};
  }
  return slots;
}

}  // namespace detail
}  // namespace ddp
