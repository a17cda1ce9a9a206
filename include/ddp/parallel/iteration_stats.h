#pragma once

// What DistributedDataParallel measured in one reduced iteration: how many buckets,
// how many of their all-reduces overlapped with backward, and how long backward
// waited for communication at its end.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp {

/// One iteration's communication, as seen from this rank.
///
/// Example:
///   loss.backward();
///   ddp::IterationStats s = dmodel->last_iteration_stats();
///   std::cout << s.buckets_done_before_end << "/" << s.num_buckets
///             << " buckets finished during backward; waited " << s.wait_ms << " ms\n";
struct IterationStats {
  /// 1 for the first reduced backward, counting only reduced (synchronised) iterations;
  /// 0 when nothing was reduced yet. At world size 1 nothing is sent (no bucket times)
  /// unless the group is a real one-rank group (InitOptions::single_rank_group).
  int64_t iteration = 0;
  /// Buckets in this iteration.
  size_t num_buckets = 0;
  /// Buckets whose all-reduce was launched from a gradient hook, i.e. while backward
  /// was still computing, before the end-of-backward callback began.
  size_t buckets_launched_before_end = 0;
  /// Buckets whose all-reduce had already completed when the end-of-backward callback
  /// began: communication fully hidden behind computation.
  size_t buckets_done_before_end = 0;
  /// Buckets whose gradients were all-reduced where they are, straight between the
  /// ranks' memory, with no copy into a bucket buffer and back (the shm backend with the
  /// default comm hook; docs/shm.md, "Gradients reduced in place").
  size_t buckets_reduced_in_place = 0;
  /// From the end of forward to the start of the end-of-backward callback (includes
  /// the loss computation between them).
  double backward_ms = 0;
  /// Time the end-of-backward callback waited for communication to complete. On a GPU,
  /// where that wait does not block the host, how long the device's stream waited at
  /// the end of backward for the last bucket (from CUDA events; docs/gpu.md).
  double wait_ms = 0;
  /// Sum over buckets of launch -> completion of its reduction (the comm hook's future;
  /// on a GPU, CUDA events around the collective, read when these stats are asked for).
  double allreduce_total_ms = 0;
  /// Per bucket, in launch order: its flat buffer's size in bytes.
  std::vector<int64_t> bucket_bytes;
  /// What this rank's collectives were given for the buckets, in bytes: the buckets'
  /// sizes with the default hook, less with a compressing one (fp16/bf16: half; PowerSGD:
  /// the uncompressed tensors and the P and Q factors). What crosses the wire per rank
  /// is this times the algorithm's factor (2(n-1)/n for a ring all-reduce).
  int64_t bytes_sent = 0;
  /// Per bucket, in launch order: its share of bytes_sent.
  std::vector<int64_t> bucket_bytes_sent;
  /// Per bucket, in launch order: launch -> completion of its reduction.
  std::vector<double> bucket_allreduce_ms;
};

}  // namespace ddp
