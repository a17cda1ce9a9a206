// The reducer's user-facing errors. Each says what happened, on which rank, to which
// parameters, and what to do.

#include "parallel/reducer.h"

#include <ddp/errors.h>

#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <c10/util/StringUtil.h>

namespace ddp {
namespace detail {
namespace {

[[noreturn]] void raise(const std::string& message) { C10_THROW_ERROR(Error, message); }

}  // namespace

std::string Reducer::where() const {
  return " on rank " + std::to_string(pg_->rank()) + " of " + std::to_string(pg_->size());
}

std::string Reducer::quoted_names(const std::vector<size_t>& indices) const {
  constexpr size_t kShown = 10;
  std::string s;
  for (size_t k = 0; k < indices.size() && k < kShown; ++k) {
    s += (k ? ", '" : "'") + names_[indices[k]] + "'";
  }
  if (indices.size() > kShown) s += " and " + std::to_string(indices.size() - kShown) + " more";
  return s;
}

void Reducer::check_usable() const {
  switch (iter_.phase) {
    case Phase::kReducing:
      fail_unfinished();
    case Phase::kFailed:
      fail_failed();
    default:
      return;
  }
}

void Reducer::fail_failed() const {
  throw ProcessGroupError(
      c10::str("DistributedDataParallel", where(),
               ": an earlier gradient reduction of this model "
               "failed, so its process group is broken and the ranks' gradients are no longer "
               "consistent. The failure was: ",
               failure_,
               ". Destroy the process group "
               "(ddp::destroy_process_group()), create a new one, and wrap the model in a new "
               "DistributedDataParallel (restore from a checkpoint to resume)."));
}

void Reducer::fail_parameter_changed(size_t index) const {
  const at::Tensor& p = params_[index];
  raise(
      c10::str("DistributedDataParallel", where(), ": parameter '", names_[index],
               "' changed "
               "after DDP was constructed: it was ",
               specs_[index].numel, " elements of ", specs_[index].dtype, " on ",
               specs_[index].device, ", and is now ", p.numel(), " elements of ", p.scalar_type(),
               " on ", p.device(),
               hooks_->hooked(p, index) ? "" : " with a new gradient accumulator",
               ". DDP's gradient hooks and buckets were built for the old parameter, so its "
               "gradients would silently no longer be averaged. Convert or move the model first "
               "(model->to(device, dtype)) and then wrap it, or wrap it again after converting."));
}

void Reducer::fail_unknown_output(const char* type) const {
  raise(c10::str(
      "DistributedDataParallel", where(),
      ": find_unused_parameters needs the tensors of "
      "forward's output to find the unused parameters, but forward returned a ",
      c10::demangle(type),
      ", which DDP cannot search. Return a Tensor, std::vector, "
      "std::tuple, std::pair or c10::IValue, or specialise ddp::OutputTensors for this type "
      "(see ddp/parallel/output_tensors.h)."));
}

void Reducer::fail_unfinished() const {
  std::vector<size_t> missing;  // the backward ended without these gradients
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!iter_.ready[i]) missing.push_back(i);
  }
  if (iter_.raised) {  // the backward itself failed before its end
    raise(c10::str("DistributedDataParallel", where(),
                   ": the previous backward did not finish (it "
                   "raised an error), so its gradients were not averaged; ",
                   missing.size(), " of ", params_.size(),
                   " parameters were still waiting for a gradient: ", quoted_names(missing),
                   ". Fix the error raised by that backward; the gradients of "
                   "this DDP model are not consistent across ranks any more."));
  }
  std::string hint;
  if (options_.static_graph) {
    hint = " With static_graph, every iteration must use the same parameters as the first "
           "one; use find_unused_parameters(true) instead for a graph that changes.";
  } else if (options_.find_unused_parameters) {
    hint = " find_unused_parameters is on, so these parameters were reachable from "
           "forward's output but backward did not reach them: does the loss use every "
           "output of forward?";
  } else {
    hint = " If they are meant to be unused in some iterations, construct DDP with "
           "DistributedDataParallelOptions().find_unused_parameters(true); if they are "
           "never trained, set requires_grad(false) on them before wrapping; otherwise "
           "make the loss depend on every output of forward.";
  }
  raise(c10::str("DistributedDataParallel", where(),
                 ": expected the previous iteration's gradient "
                 "reduction to have finished before this forward, but ",
                 missing.size(), " of ", params_.size(),
                 " parameters got no gradient in that backward: ", quoted_names(missing),
                 ". DDP averages every parameter's gradient in each backward "
                 "and cannot finish without them (their buckets were not reduced, so gradients now "
                 "differ across ranks; if ranks skipped different parameters, buckets that some "
                 "ranks launched can never complete, so recreate the process group).",
                 hint,
                 " (If that backward raised an error, fix that first: it stopped before these "
                 "gradients.)"));
}

void Reducer::fail_backward_without_forward(size_t index) const {
  raise(c10::str(
      "DistributedDataParallel", where(), ": a gradient arrived for parameter '", names_[index],
      "', but no forward through the DDP wrapper is waiting for its "
      "backward: the gradients of the last forward were already reduced (",
      num_reduced_,
      " iteration(s) so far). Each reduced backward needs its own forward through DDP: "
      "call dmodel(x) or dmodel->forward(x), not the wrapped module directly, and do not "
      "call backward twice on one graph (retain_graph). To accumulate gradients over "
      "several backward calls, run those forwards and backwards under dmodel->no_sync()."));
}

void Reducer::fail_ready_twice(size_t index) const {
  if (iter_.unused[index]) {
    raise(c10::str(
        "DistributedDataParallel", where(), ": parameter '", names_[index],
        "' was marked "
        "ready twice in one backward. find_unused_parameters found it unreachable from "
        "forward's output and reduced it as unused, yet a gradient for it arrived "
        "afterwards: it is used outside forward (e.g. a regularisation term computed from "
        "the wrapped module's parameters and added to the loss). Compute such terms inside "
        "forward and return them, so DDP can see them."));
  }
  raise(c10::str(
      "DistributedDataParallel", where(), ": parameter '", names_[index],
      "' was marked "
      "ready twice in one backward: its gradient accumulator ran twice (reentrant backward "
      "or activation checkpointing). DDP reduces each gradient once per backward; if the "
      "graph is the same in every iteration, construct DDP with static_graph(true), which "
      "allows this."));
}

void Reducer::fail_static_graph_changed(size_t index, int calls) const {
  raise(c10::str("DistributedDataParallel", where(), ": with static_graph, parameter '",
                 names_[index], "' got ", calls, " gradient(s) in this backward but ",
                 expected_calls_[index],
                 " in the first iteration: the graph changed. Use find_unused_parameters(true) "
                 "instead of static_graph for graphs that change."));
}

void Reducer::check_buckets_agree() {
  std::string mine;
  for (const auto& bucket : assignment_) {
    for (size_t i : bucket) mine += std::to_string(i) + ",";
    mine += ";";
  }
  const std::vector<std::string> all = pg_->all_gather_bytes(mine);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    throw MismatchError("DistributedDataParallel" + where() +
                        " (DDP_DEBUG=detail): after the "
                        "bucket rebuild, rank " +
                        std::to_string(r) +
                        " has the bucket "
                        "assignment '" +
                        all[r] + "' while rank 0 has '" + all[0] +
                        "' "
                        "(parameter indices per bucket). Ranks must wrap the same model "
                        "with the same options.");
  }
}

}  // namespace detail
}  // namespace ddp
