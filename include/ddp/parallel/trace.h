#pragma once

// Timeline of a DDP run, as a Chrome trace-event JSON file per rank (open it in
// https://ui.perfetto.dev or chrome://tracing). DistributedDataParallel records
// forward, backward, each bucket's all-reduce and the wait at the end of backward when
// DistributedDataParallelOptions::trace_path is set; user code marks its own spans
// (the optimizer step, data loading) with a Scope. With tracing off a Scope costs one
// branch.
//
// Example:
//   auto dmodel = ddp::DistributedDataParallel(
//       model, ddp::DistributedDataParallelOptions().trace_path("/tmp/run.json"));
//   ...
//   {
//     ddp::trace::Scope step(dmodel, "optimizer.step");
//     optimizer.step();
//   }

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

namespace ddp {

class DistributedDataParallelBase;

namespace detail {
class TraceWriter;
}  // namespace detail

namespace trace {

/// Records [construction, destruction) as a span named `name` on the "user" track of
/// `model`'s trace. Does nothing when the model has no trace_path.
class Scope {
 public:
  Scope(const DistributedDataParallelBase& model, std::string name);
  /// Accepts the holder (ddp::DistributedDataParallel<M>) as well as the module.
  template <typename Holder,
            typename = std::enable_if_t<std::is_base_of<DistributedDataParallelBase,
                                                        typename Holder::ContainedType>::value>>
  Scope(const Holder& holder, std::string name) : Scope(*holder, std::move(name)) {}
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  std::shared_ptr<detail::TraceWriter> writer_;
  std::string name_;
  int64_t start_us_ = 0;
};

}  // namespace trace
}  // namespace ddp
