// torch.distributed's collectives beyond all_reduce, broadcast and the flat ones, and
// point to point: ProcessGroup's methods and the free functions with a group argument.
//
// Each method checks its arguments on this rank before anything is sent (ranks in range,
// list lengths, one shape and dtype where one is needed, an op the dtype takes), so a
// mistake is an error on the rank that made it and never a hang of the others. What a
// rank cannot see alone (another rank's shapes or split sizes) DDP_DEBUG=detail checks:
// Note [Collective fingerprints], and the pairwise split check below. Non-contiguous
// tensors go through contiguous copies, copied back once the collective is done. AVG is
// a SUM then a division, as in all_reduce.

#include <ddp/distributed/process_group.h>

#include <ddp/errors.h>

#include "distributed/common/check.h"
#include "distributed/comm.h"
#include "distributed/global_ranks.h"
#include "distributed/work.h"

#include <ATen/ATen.h>

#include <functional>
#include <sstream>

namespace ddp {

const char* reduce_op_name(ReduceOp op) {
  switch (op.kind()) {
    case ReduceOp::SUM:
      return "SUM";
    case ReduceOp::AVG:
      return "AVG";
    case ReduceOp::MAX:
      return "MAX";
    case ReduceOp::MIN:
      return "MIN";
    case ReduceOp::PRODUCT:
      return "PRODUCT";
    case ReduceOp::BAND:
      return "BAND";
    case ReduceOp::BOR:
      return "BOR";
    case ReduceOp::BXOR:
      return "BXOR";
    case ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
  }
  return "?";
}

namespace {

using detail::PendingWork;

void check_defined(const char* what, const char* name, const at::Tensor& t, int rank) {
  DDP_CHECK(t.defined(), what, " got an undefined ", name, " on rank ", rank,
            "; pass a tensor (torch::empty(...) for one to be filled).");
}

// Whether `op` applies to `t`'s dtype on this group; throws naming both otherwise.
void check_op(const char* what, ReduceOp op, const at::Tensor& t, const detail::Comm& comm) {
  const int rank = comm.config().rank;
  const c10::ScalarType dtype = t.scalar_type();
  switch (op.kind()) {
    case ReduceOp::AVG:
      DDP_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype), what,
                " with AVG needs a floating-point tensor, but got ", dtype, " on rank ", rank,
                ". Use SUM and divide yourself.");
      break;
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR:
      DDP_CHECK(at::isIntegralType(dtype, /*includeBool=*/true), what, " with ", reduce_op_name(op),
                " needs an integral or bool tensor, but got ", dtype, " on rank ", rank,
                ": bitwise reductions have no meaning on floating point.");
      break;
    case ReduceOp::PREMUL_SUM:
      DDP_CHECK(op.has_factor(), what, " got a bare PREMUL_SUM on rank ", rank,
                "; make it with ddp::ReduceOp::premul_sum(factor).");
      DDP_CHECK(comm.reduces_op(op), what,
                " with PREMUL_SUM runs only on the nccl backend, but "
                "this group's is \"",
                comm.config().backend, "\" (rank ", rank,
                "). Multiply by the factor yourself and use SUM.");
      DDP_CHECK(at::isFloatingType(dtype), what,
                " with PREMUL_SUM needs a floating-point tensor, "
                "but got ",
                dtype, " on rank ", rank, ".");
      break;
    default:
      break;
  }
}

ReduceOp lowered(ReduceOp op) { return op == ReduceOp::AVG ? ReduceOp(ReduceOp::SUM) : op; }

void check_peer(const char* what, const char* arg, int peer, const detail::Comm& comm) {
  const int size = comm.config().world_size;
  DDP_CHECK(peer >= 0 && peer < size, what, "'s ", arg, " must be a rank of the group, 0..",
            size - 1, ", but got ", peer, " on rank ", comm.config().rank, ".");
}

// `t` is like `ref`: same dtype and shape.
void check_like(const char* what, const char* list, size_t i, const at::Tensor& t,
                const at::Tensor& ref, const char* ref_name, int rank) {
  DDP_CHECK(t.defined(), what, ": ", list, "[", i, "] is undefined on rank ", rank, ".");
  DDP_CHECK(t.scalar_type() == ref.scalar_type() && t.sizes() == ref.sizes(), what, ": ", list, "[",
            i, "] is ", t.scalar_type(), " ", t.sizes(), " but ", ref_name, " is ",
            ref.scalar_type(), " ", ref.sizes(), " on rank ", rank,
            "; every entry must have the shape and dtype of ", ref_name,
            " (use all_gather_object, or pad, for uneven sizes).");
}

void check_count(const char* what, const char* list, size_t got, int size, int rank) {
  DDP_CHECK(got == static_cast<size_t>(size), what, ": ", list, " must hold one tensor per rank (",
            size, "), but holds ", got, " on rank ", rank, ".");
}

// A contiguous tensor to hand the backend, and the copies back to the caller's once the
// collective is done.
struct Staged {
  std::vector<at::Tensor> staged;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;  // (from staged, to caller's)

  at::Tensor out(const at::Tensor& t) {
    if (t.is_contiguous()) return t;
    at::Tensor c = t.contiguous();
    copy_back.emplace_back(c, t);
    return c;
  }
  static at::Tensor in(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }
};

// `pending`, then the copies back and the AVG division (of `avg_of`, by `divisor`). The
// step runs once however the work is awaited (Note [After runs once], work.cpp).
Work finish(std::shared_ptr<PendingWork> pending, Staged staged, std::vector<at::Tensor> outputs,
            std::vector<at::Tensor> avg_of = {}, int divisor = 1) {
  std::function<void()> after;
  if (!staged.copy_back.empty() || (!avg_of.empty() && divisor > 1)) {
    after = [copies = std::move(staged.copy_back), avg_of = std::move(avg_of), divisor] {
      for (const at::Tensor& t : avg_of) {
        if (divisor > 1) t.div_(divisor);
      }
      for (const auto& c : copies) c.second.copy_(c.first);
    };
  }
  if (after) pending = detail::then_work(std::move(pending), after, std::move(outputs));
  return detail::make_work(std::move(pending));
}

}  // namespace

// ---- Reductions, gathers, scatters ----------------------------------------------------

Work ProcessGroup::reduce_async(at::Tensor& tensor, int dst, ReduceOp op) {
  check_defined("reduce", "tensor", tensor, rank());
  check_peer("reduce", "dst", dst, comm());
  check_op("reduce", op, tensor, comm());
  Staged st;
  std::vector<at::Tensor> tensors{st.out(tensor)};
  auto pending = comm().reduce(tensors, dst, lowered(op));
  const bool divide = op == ReduceOp::AVG && rank() == dst;
  return finish(std::move(pending), std::move(st), {tensor},
                divide ? tensors : std::vector<at::Tensor>{}, size());
}

void ProcessGroup::reduce(at::Tensor& tensor, int dst, ReduceOp op) {
  reduce_async(tensor, dst, op).wait();
}

Work ProcessGroup::gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& gather_list,
                                int dst) {
  check_defined("gather", "tensor", tensor, rank());
  check_peer("gather", "dst", dst, comm());
  Staged st;
  std::vector<std::vector<at::Tensor>> outputs;
  if (rank() == dst) {
    check_count("gather", "gather_list", gather_list.size(), size(), rank());
    outputs.emplace_back();
    for (size_t i = 0; i < gather_list.size(); ++i) {
      check_like("gather", "gather_list", i, gather_list[i], tensor, "tensor", rank());
      outputs[0].push_back(st.out(gather_list[i]));
    }
  } else {
    DDP_CHECK(gather_list.empty(),
              "gather: gather_list must be empty on the ranks other than dst (", dst,
              "), as Python's None, but holds ", gather_list.size(), " tensor(s) on rank ", rank(),
              ".");
  }
  std::vector<at::Tensor> inputs{Staged::in(tensor)};
  auto pending = comm().gather(outputs, inputs, dst);
  return finish(std::move(pending), std::move(st), rank() == dst ? gather_list : inputs);
}

void ProcessGroup::gather(const at::Tensor& tensor, std::vector<at::Tensor>& gather_list, int dst) {
  gather_async(tensor, gather_list, dst).wait();
}

Work ProcessGroup::scatter_async(at::Tensor& tensor, const std::vector<at::Tensor>& scatter_list,
                                 int src) {
  check_defined("scatter", "tensor", tensor, rank());
  check_peer("scatter", "src", src, comm());
  std::vector<std::vector<at::Tensor>> inputs;
  if (rank() == src) {
    check_count("scatter", "scatter_list", scatter_list.size(), size(), rank());
    inputs.emplace_back();
    for (size_t i = 0; i < scatter_list.size(); ++i) {
      check_like("scatter", "scatter_list", i, scatter_list[i], tensor, "tensor", rank());
      inputs[0].push_back(Staged::in(scatter_list[i]));
    }
  } else {
    DDP_CHECK(scatter_list.empty(),
              "scatter: scatter_list must be empty on the ranks other than "
              "src (",
              src, "), as Python's None, but holds ", scatter_list.size(), " tensor(s) on rank ",
              rank(), ".");
  }
  Staged st;
  std::vector<at::Tensor> outputs{st.out(tensor)};
  auto pending = comm().scatter(outputs, inputs, src);
  return finish(std::move(pending), std::move(st), {tensor});
}

void ProcessGroup::scatter(at::Tensor& tensor, const std::vector<at::Tensor>& scatter_list,
                           int src) {
  scatter_async(tensor, scatter_list, src).wait();
}

Work ProcessGroup::reduce_scatter_async(at::Tensor& output,
                                        const std::vector<at::Tensor>& input_list, ReduceOp op) {
  check_defined("reduce_scatter", "output", output, rank());
  check_op("reduce_scatter", op, output, comm());
  check_count("reduce_scatter", "input_list", input_list.size(), size(), rank());
  std::vector<std::vector<at::Tensor>> inputs(1);
  for (size_t i = 0; i < input_list.size(); ++i) {
    check_like("reduce_scatter", "input_list", i, input_list[i], output, "output", rank());
    inputs[0].push_back(Staged::in(input_list[i]));
  }
  Staged st;
  std::vector<at::Tensor> outputs{st.out(output)};
  auto pending = comm().reduce_scatter(outputs, inputs, lowered(op));
  return finish(std::move(pending), std::move(st), {output},
                op == ReduceOp::AVG ? outputs : std::vector<at::Tensor>{}, size());
}

void ProcessGroup::reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& input_list,
                                  ReduceOp op) {
  reduce_scatter_async(output, input_list, op).wait();
}

Work ProcessGroup::all_gather_async(std::vector<at::Tensor>& tensor_list,
                                    const at::Tensor& tensor) {
  check_defined("all_gather", "tensor", tensor, rank());
  check_count("all_gather", "tensor_list", tensor_list.size(), size(), rank());
  Staged st;
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (size_t i = 0; i < tensor_list.size(); ++i) {
    check_like("all_gather", "tensor_list", i, tensor_list[i], tensor, "tensor", rank());
    outputs[0].push_back(st.out(tensor_list[i]));
  }
  std::vector<at::Tensor> inputs{Staged::in(tensor)};
  auto pending = comm().all_gather(outputs, inputs);
  return finish(std::move(pending), std::move(st), tensor_list);
}

void ProcessGroup::all_gather(std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor) {
  all_gather_async(tensor_list, tensor).wait();
}

Work ProcessGroup::all_to_all_async(std::vector<at::Tensor>& output_list,
                                    const std::vector<at::Tensor>& input_list) {
  check_count("all_to_all", "output_list", output_list.size(), size(), rank());
  check_count("all_to_all", "input_list", input_list.size(), size(), rank());
  Staged st;
  std::vector<at::Tensor> outputs, inputs;
  for (size_t i = 0; i < input_list.size(); ++i) {
    DDP_CHECK(input_list[i].defined() && output_list[i].defined(), "all_to_all: entry ", i,
              " of input_list or output_list is undefined on rank ", rank(), ".");
    DDP_CHECK(input_list[i].scalar_type() == input_list[0].scalar_type() &&
                  output_list[i].scalar_type() == input_list[0].scalar_type(),
              "all_to_all: every tensor must have one dtype, but entry ", i, " has ",
              input_list[i].scalar_type(), " in and ", output_list[i].scalar_type(),
              " out, and input_list[0] ", input_list[0].scalar_type(), " on rank ", rank(), ".");
    inputs.push_back(Staged::in(input_list[i]));
    outputs.push_back(st.out(output_list[i]));
  }
  DDP_CHECK(output_list[rank()].numel() == input_list[rank()].numel(), "all_to_all: rank ", rank(),
            " sends itself input_list[", rank(), "] of ", input_list[rank()].numel(),
            " element(s) into output_list[", rank(), "] of ", output_list[rank()].numel(), ".");
  auto pending = comm().all_to_all(outputs, inputs);
  return finish(std::move(pending), std::move(st), output_list);
}

void ProcessGroup::all_to_all(std::vector<at::Tensor>& output_list,
                              const std::vector<at::Tensor>& input_list) {
  all_to_all_async(output_list, input_list).wait();
}

namespace {

// Split sizes in rows: given, or equal parts of `rows`.
std::vector<int64_t> splits_of(const char* name, const std::vector<int64_t>& given, int64_t rows,
                               int size, int rank) {
  if (given.empty()) {
    DDP_CHECK(rows % size == 0, "all_to_all_single: with no ", name, ", dim 0 (", rows,
              " rows) must split into ", size, " equal parts, but does not, on rank ", rank,
              "; give the split sizes.");
    return std::vector<int64_t>(size, rows / size);
  }
  DDP_CHECK(given.size() == static_cast<size_t>(size), "all_to_all_single: ", name,
            " must hold one size per rank (", size, "), but holds ", given.size(), " on rank ",
            rank, ".");
  int64_t sum = 0;
  for (int64_t s : given) {
    DDP_CHECK(s >= 0, "all_to_all_single: ", name, " holds a negative size (", s, ") on rank ",
              rank, ".");
    sum += s;
  }
  DDP_CHECK(sum == rows, "all_to_all_single: ", name, " adds up to ", sum,
            " rows, but the tensor has ", rows, " in dim 0 on rank ", rank, ".");
  return given;
}

}  // namespace

Work ProcessGroup::all_to_all_single_async(at::Tensor& output, const at::Tensor& input,
                                           const std::vector<int64_t>& output_split_sizes,
                                           const std::vector<int64_t>& input_split_sizes) {
  check_defined("all_to_all_single", "input", input, rank());
  check_defined("all_to_all_single", "output", output, rank());
  DDP_CHECK(input.dim() >= 1 && output.dim() == input.dim() &&
                input.sizes().slice(1) == output.sizes().slice(1) &&
                input.scalar_type() == output.scalar_type(),
            "all_to_all_single: input and output must have one dtype and rows of one shape, but "
            "got input ",
            input.scalar_type(), " ", input.sizes(), " and output ", output.scalar_type(), " ",
            output.sizes(), " on rank ", rank(), ".");
  std::vector<int64_t> out_splits =
      splits_of("output_split_sizes", output_split_sizes, output.size(0), size(), rank());
  std::vector<int64_t> in_splits =
      splits_of("input_split_sizes", input_split_sizes, input.size(0), size(), rank());
  DDP_CHECK(out_splits[rank()] == in_splits[rank()], "all_to_all_single: rank ", rank(),
            " sends itself ", in_splits[rank()], " row(s) (input_split_sizes) but expects ",
            out_splits[rank()], " (output_split_sizes).");
  if (comm().config().debug_detail && size() > 1) {
    // Note [Collective fingerprints] holds what each rank sees alone; the split sizes must
    // also agree pairwise: what rank r sends rank s is what s expects from r.
    at::Tensor mine = at::empty({2 * size()}, at::kLong);
    for (int r = 0; r < size(); ++r) {
      mine[r] = in_splits[r];
      mine[size() + r] = out_splits[r];
    }
    const at::Tensor all = detail::all_gather_host(*this, mine);  // [size, 2 * size]
    const auto a = all.accessor<int64_t, 2>();
    for (int r = 0; r < size(); ++r) {
      for (int s = 0; s < size(); ++s) {
        if (a[r][s] != a[s][size() + r]) {
          throw MismatchError(
              c10::str("all_to_all_single: rank ", r, " sends rank ", s, " ", a[r][s],
                       " row(s) (its input_split_sizes[", s, "]), but rank ", s, " expects ",
                       a[s][size() + r], " (its output_split_sizes[", r, "]); seen on rank ",
                       rank(),
                       " (DDP_DEBUG=detail). Make every pair of ranks agree on the split sizes."));
        }
      }
    }
  }
  Staged st;
  at::Tensor out = st.out(output);
  at::Tensor in = Staged::in(input);
  auto pending = comm().all_to_all_single(out, in, out_splits, in_splits);
  return finish(std::move(pending), std::move(st), {output});
}

void ProcessGroup::all_to_all_single(at::Tensor& output, const at::Tensor& input,
                                     const std::vector<int64_t>& output_split_sizes,
                                     const std::vector<int64_t>& input_split_sizes) {
  all_to_all_single_async(output, input, output_split_sizes, input_split_sizes).wait();
}

// ---- Point to point -------------------------------------------------------------------

namespace {

void check_p2p(const char* what, const char* arg, int peer, int tag, const detail::Comm& comm) {
  check_peer(what, arg, peer, comm);
  DDP_CHECK(peer != comm.config().rank, what, ": rank ", comm.config().rank,
            " cannot send to or receive from itself; copy the tensor instead.");
  DDP_CHECK(tag >= 0, what, "'s tag must be 0 or more, but got ", tag, " on rank ",
            comm.config().rank, ".");
}

}  // namespace

Work ProcessGroup::isend(const at::Tensor& tensor, int dst, int tag) {
  check_defined("isend", "tensor", tensor, rank());
  check_p2p("isend", "dst", dst, tag, comm());
  std::vector<at::Tensor> tensors{Staged::in(tensor)};
  return detail::make_work(comm().send(tensors, dst, tag));
}

void ProcessGroup::send(const at::Tensor& tensor, int dst, int tag) {
  isend(tensor, dst, tag).wait();
}

Work ProcessGroup::irecv(at::Tensor& tensor, std::optional<int> src, int tag) {
  check_defined("irecv", "tensor", tensor, rank());
  if (src) {
    check_p2p("irecv", "src", *src, tag, comm());
  } else {
    DDP_CHECK(size() > 1, "irecv from any source on rank ", rank(),
              " of a group of one: no other rank could send. Name the source.");
    DDP_CHECK(tag >= 0, "irecv's tag must be 0 or more, but got ", tag, ".");
  }
  Staged st;
  std::vector<at::Tensor> tensors{st.out(tensor)};
  auto pending = comm().recv(tensors, src ? *src : detail::Comm::kAnySource, tag);
  return finish(std::move(pending), std::move(st), {tensor});
}

int ProcessGroup::recv(at::Tensor& tensor, std::optional<int> src, int tag) {
  Work work = irecv(tensor, src, tag);
  work.wait();
  return work.source_rank();
}

std::vector<Work> ProcessGroup::batch_isend_irecv(const std::vector<P2POp>& p2p_op_list) {
  DDP_CHECK(!p2p_op_list.empty(), "batch_isend_irecv got no ops on rank ", rank(), ".");
  std::vector<detail::Comm::P2P> ops;
  std::vector<Staged> staged(p2p_op_list.size());
  for (size_t i = 0; i < p2p_op_list.size(); ++i) {
    const P2POp& op = p2p_op_list[i];
    const bool send = op.op == P2POp::ISEND;
    check_defined("batch_isend_irecv", "tensor", op.tensor, rank());
    check_p2p(send ? "batch_isend_irecv (isend)" : "batch_isend_irecv (irecv)", "peer", op.peer,
              op.tag, comm());
    detail::Comm::P2P p;
    p.send = send;
    p.tensor = send ? Staged::in(op.tensor) : staged[i].out(op.tensor);
    p.peer = op.peer;
    p.tag = op.tag;
    ops.push_back(std::move(p));
  }
  std::vector<std::shared_ptr<PendingWork>> pending = comm().batch_p2p(ops);
  std::vector<Work> works;
  for (size_t i = 0; i < pending.size(); ++i) {
    works.push_back(finish(std::move(pending[i]), std::move(staged[i]), {p2p_op_list[i].tensor}));
  }
  return works;
}

// ---- The same on a group, or the default one ----------------------------------------

using detail::global_rank_for;
using detail::group_or_default;
using detail::group_rank_for;

void reduce(at::Tensor& tensor, int dst, ReduceOp op, const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->reduce(tensor, group_rank_for(group, dst, "ddp::reduce", "dst"), op);
}
Work reduce_async(at::Tensor& tensor, int dst, ReduceOp op,
                  const std::shared_ptr<ProcessGroup>& group) {
  return group_or_default(group)->reduce_async(
      tensor, group_rank_for(group, dst, "ddp::reduce_async", "dst"), op);
}
void gather(const at::Tensor& tensor, std::vector<at::Tensor>& gather_list, int dst,
            const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->gather(tensor, gather_list,
                                  group_rank_for(group, dst, "ddp::gather", "dst"));
}
Work gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& gather_list, int dst,
                  const std::shared_ptr<ProcessGroup>& group) {
  return group_or_default(group)->gather_async(tensor, gather_list,
                                               group_rank_for(group, dst, "ddp::gather_async",
                                                              "dst"));
}
void scatter(at::Tensor& tensor, const std::vector<at::Tensor>& scatter_list, int src,
             const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->scatter(tensor, scatter_list,
                                   group_rank_for(group, src, "ddp::scatter", "src"));
}
Work scatter_async(at::Tensor& tensor, const std::vector<at::Tensor>& scatter_list, int src,
                   const std::shared_ptr<ProcessGroup>& group) {
  return group_or_default(group)->scatter_async(tensor, scatter_list,
                                                group_rank_for(group, src, "ddp::scatter_async",
                                                               "src"));
}
void reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& input_list, ReduceOp op,
                    const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->reduce_scatter(output, input_list, op);
}
Work reduce_scatter_async(at::Tensor& output, const std::vector<at::Tensor>& input_list,
                          ReduceOp op, const std::shared_ptr<ProcessGroup>& group) {
  return group_or_default(group)->reduce_scatter_async(output, input_list, op);
}
void all_gather(std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor,
                const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->all_gather(tensor_list, tensor);
}
Work all_gather_async(std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor,
                      const std::shared_ptr<ProcessGroup>& group) {
  return group_or_default(group)->all_gather_async(tensor_list, tensor);
}
void all_to_all(std::vector<at::Tensor>& output_list, const std::vector<at::Tensor>& input_list,
                const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->all_to_all(output_list, input_list);
}
Work all_to_all_async(std::vector<at::Tensor>& output_list,
                      const std::vector<at::Tensor>& input_list,
                      const std::shared_ptr<ProcessGroup>& group) {
  return group_or_default(group)->all_to_all_async(output_list, input_list);
}
void all_to_all_single(at::Tensor& output, const at::Tensor& input,
                       const std::vector<int64_t>& output_split_sizes,
                       const std::vector<int64_t>& input_split_sizes,
                       const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->all_to_all_single(output, input, output_split_sizes, input_split_sizes);
}
Work all_to_all_single_async(at::Tensor& output, const at::Tensor& input,
                             const std::vector<int64_t>& output_split_sizes,
                             const std::vector<int64_t>& input_split_sizes,
                             const std::shared_ptr<ProcessGroup>& group) {
  return group_or_default(group)->all_to_all_single_async(output, input, output_split_sizes,
                                                          input_split_sizes);
}
void send(const at::Tensor& tensor, int dst, int tag, const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->send(tensor, group_rank_for(group, dst, "ddp::send", "dst"), tag);
}
int recv(at::Tensor& tensor, std::optional<int> src, int tag,
         const std::shared_ptr<ProcessGroup>& group) {
  std::optional<int> from;
  if (src) from = group_rank_for(group, *src, "ddp::recv", "src");
  return global_rank_for(group, group_or_default(group)->recv(tensor, from, tag));
}
Work isend(const at::Tensor& tensor, int dst, int tag, const std::shared_ptr<ProcessGroup>& group) {
  return group_or_default(group)->isend(tensor, group_rank_for(group, dst, "ddp::isend", "dst"),
                                        tag);
}
Work irecv(at::Tensor& tensor, std::optional<int> src, int tag,
           const std::shared_ptr<ProcessGroup>& group) {
  std::optional<int> from;
  if (src) from = group_rank_for(group, *src, "ddp::irecv", "src");
  return group_or_default(group)->irecv(tensor, from, tag);
}
std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& p2p_op_list,
                                    const std::shared_ptr<ProcessGroup>& group) {
  std::vector<P2POp> ops = p2p_op_list;
  for (P2POp& op : ops) op.peer = group_rank_for(group, op.peer, "ddp::batch_isend_irecv", "peer");
  return group_or_default(group)->batch_isend_irecv(ops);
}

}  // namespace ddp
