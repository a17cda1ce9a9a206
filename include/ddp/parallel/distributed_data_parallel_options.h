#pragma once

// Options of ddp::DistributedDataParallel. Names and defaults follow
// torch.nn.parallel.DistributedDataParallel; each field says what it means for a single
// process.

#include <ddp/distributed/process_group.h>

#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

/// How DistributedDataParallel averages gradients across ranks.
///
/// Example:
///   auto dmodel = ddp::DistributedDataParallel(
///       model, ddp::DistributedDataParallelOptions()
///                  .bucket_cap_mb(10)
///                  .find_unused_parameters(true)
///                  .trace_path("/tmp/trace.json"));
struct DistributedDataParallelOptions {
  /// The one device this process's module lives on, e.g. {local_rank} for a GPU. Empty
  /// for CPU modules (and for a single process on CPU). DDP does not move the module:
  /// move it first, then wrap it; this is checked against the parameters' device.
  TORCH_ARG(std::vector<int64_t>, device_ids) = {};

  /// Broadcast the module's buffers (BatchNorm running stats) from rank 0 before every
  /// forward that records gradients. Single process: no effect.
  TORCH_ARG(bool, broadcast_buffers) = true;

  /// Bucket size limit in MiB. Gradients are all-reduced in buckets of about this size,
  /// each launched as soon as its gradients are ready. The first bucket (the first
  /// gradients to be ready) is capped at min(1 MiB, bucket_cap_mb) so that
  /// communication starts early. Must be > 0.
  TORCH_ARG(double, bucket_cap_mb) = 25;

  /// Walk the autograd graph after each forward and mark parameters it does not reach
  /// as ready with a zero contribution, so backward completes. A parameter no rank used
  /// keeps its .grad() untouched. Costs a graph walk per iteration; leave off when every
  /// parameter always gets a gradient.
  TORCH_ARG(bool, find_unused_parameters) = false;

  /// Make each parameter's .grad() a view into its bucket, so gradients are reduced in
  /// place and no second copy of them is kept. .grad() stays a plain tensor (no
  /// autograd view), so optimizer.zero_grad() works on it.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;

  /// Promise that the set of used parameters and the order of their gradients is the
  /// same in every iteration. The first iteration reduces everything at the end and
  /// records the graph; later ones reuse it without walking the graph, and a gradient
  /// accumulator may then fire more than once per backward (as with activation
  /// checkpointing) as long as it does so every iteration.
  TORCH_ARG(bool, static_graph) = false;

  /// The process group to reduce over; nullptr: the default group
  /// (ddp::init_process_group must have been called).
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;

  /// Write a Chrome trace-event JSON file (open in Perfetto or chrome://tracing):
  /// forward, backward, each bucket's all-reduce, the wait at the end of backward and
  /// user scopes (ddp::trace::Scope). One file per rank: "{rank}" in the path is
  /// replaced by the rank, else ".rank<r>" is inserted before a ".json" ending (or
  /// appended). Empty: no tracing, and recording costs one branch.
  TORCH_ARG(std::string, trace_path) = "";
};

}  // namespace ddp
