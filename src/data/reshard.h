#pragma once

#include <ddp/data/distributed_sampler.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp {
namespace detail {

// Note [Re-sharding an epoch]
// An epoch of DistributedSampler is a list of samples split round robin: with R ranks
// and the list L of m samples, rank r takes L[r], L[r + R], ... — per = ceil(m / R)
// samples each, the list padded cyclically from its head (or per = floor(m / R), the
// tail dropped, with drop_last). The first layout of an epoch splits Python's order
// (the permutation of the whole dataset), so that it equals Python's sampler.
//
// When a run stops mid-epoch and resumes with another number of ranks, each rank of the
// old layout had handed out the first positions[r] of its share. The slots k of the
// split list with k / R < positions[k % R] were seen. What the new layout splits is the
// rest of the list, in its order, without the padding (slots k >= m repeat samples that
// are also in the list) and without what drop_last dropped (slots past per * R, which
// are never in the list). A second change of layout in the same epoch repeats the step
// on that list. So every sample of the epoch is handed out once, except those a layout
// pads with (as Python pads) or drops; and every rank computes the same lists from the
// same stages, with no communication.

/// Samples per rank when `m` samples are split among `replicas` ranks.
size_t share_size(size_t m, int64_t replicas, bool drop_last);

/// Samples per rank of a layout of `replicas` ranks that follows `stages` (oldest first)
/// in an epoch of `dataset_size` samples: the sampler's num_samples(), without building
/// the epoch's order. Throws as remaining_after does.
size_t samples_per_rank(size_t dataset_size, const std::vector<DistributedSamplerStage>& stages,
                        int64_t replicas, bool drop_last);

/// The samples of the epoch's `order` that `stages` (oldest first) had not handed out, in
/// order. Throws when a stage's positions do not fit it.
std::vector<size_t> remaining_after(std::vector<size_t> order,
                                    const std::vector<DistributedSamplerStage>& stages,
                                    bool drop_last);

}  // namespace detail
}  // namespace ddp
