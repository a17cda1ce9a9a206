#pragma once

#include <cstdint>
#include <vector>

namespace ddp {
namespace detail {

/// torch.randperm(n, generator=g) after g.manual_seed(seed), as Python computes it.
///
/// Note [randperm equivalence]
/// Python's torch.randperm and at::randperm are the same ATen CPU kernel, and a CPU
/// generator made with a seed is in the same state as torch.Generator().manual_seed(seed)
/// (an mt19937 seeded with the low 32 bits; a negative Python seed is taken modulo
/// 2**64). So the permutation is identical to Python's whenever LibTorch and Python's
/// torch are the same version. Across versions: the kernel swaps element i with
/// i + random() % (n - i) for n < 2**32 / 20 (214748364) in every release; from 2.x on,
/// larger n use a different algorithm (random64(), inside-out Fisher-Yates), so for
/// datasets that large LibTorch 1.13 and Python 2.x disagree. Tested against Python
/// for n from 1 to a few million (SamplerPythonTest).
std::vector<int64_t> python_randperm(int64_t n, uint64_t seed);

}  // namespace detail
}  // namespace ddp
