#include "data/permutation.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace ddp {
namespace detail {

std::vector<int64_t> python_randperm(int64_t n, uint64_t seed) {
  // A private generator: the global one (and thus the user's RNG stream) is untouched.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
  const int64_t* data = perm.data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + n);
}

}  // namespace detail
}  // namespace ddp
