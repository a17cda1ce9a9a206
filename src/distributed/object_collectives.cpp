// torch.distributed's object collectives for C++ values (c10::IValue): each object is
// pickled with LibTorch's pickler (the bytes Python's torch.load reads), its length and
// bytes move through the group's tensor collectives, and the receivers unpickle them.
// The protocols are PyTorch's (distributed_c10d.py): lengths first, then the bytes,
// padded to the longest where a collective needs one size everywhere.

#include <ddp/distributed/process_group.h>

#include "distributed/common/check.h"
#include "distributed/comm.h"
#include "distributed/global_ranks.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cstring>

namespace ddp {
namespace {

std::vector<char> pickle(const c10::IValue& obj) { return torch::jit::pickle_save(obj); }

c10::IValue unpickle(const uint8_t* data, int64_t n) {
  std::vector<char> bytes(reinterpret_cast<const char*>(data),
                          reinterpret_cast<const char*>(data) + n);
  return torch::jit::pickle_load(bytes);
}

at::Tensor longs(const std::vector<int64_t>& values) {
  at::Tensor t = at::empty({static_cast<int64_t>(values.size())}, at::kLong);
  std::copy(values.begin(), values.end(), t.data_ptr<int64_t>());
  return t;
}

// Every pickle of `objects` one after another, and each one's length.
at::Tensor concat(const std::vector<c10::IValue>& objects, std::vector<int64_t>& sizes) {
  std::vector<std::vector<char>> pickles;
  int64_t total = 0;
  for (const c10::IValue& obj : objects) {
    pickles.push_back(pickle(obj));
    sizes.push_back(static_cast<int64_t>(pickles.back().size()));
    total += sizes.back();
  }
  at::Tensor bytes = at::empty({total}, at::kByte);
  int64_t at_byte = 0;
  for (const auto& p : pickles) {
    std::memcpy(bytes.data_ptr<uint8_t>() + at_byte, p.data(), p.size());
    at_byte += static_cast<int64_t>(p.size());
  }
  return bytes;
}

// `bytes` (on the host) cut by `sizes` and unpickled into `into`.
void split_into(const at::Tensor& bytes, const int64_t* sizes, size_t n,
                std::vector<c10::IValue>& into) {
  const uint8_t* data = bytes.data_ptr<uint8_t>();
  int64_t at_byte = 0;
  for (size_t i = 0; i < n; ++i) {
    into[i] = unpickle(data + at_byte, sizes[i]);
    at_byte += sizes[i];
  }
}

}  // namespace

void ProcessGroup::broadcast_object_list(std::vector<c10::IValue>& object_list, int src) {
  DDP_CHECK(src >= 0 && src < size(),
            "broadcast_object_list's src must be a rank of the group, 0..", size() - 1,
            ", but got ", src, " on rank ", rank(), ".");
  std::vector<int64_t> sizes;
  at::Tensor bytes;
  if (rank() == src) bytes = concat(object_list, sizes);
  // The count first, so that a rank whose list has another length fails clearly, after
  // taking part in every step (nobody is left waiting).
  const at::Tensor count =
      detail::broadcast_host(*this, longs({static_cast<int64_t>(object_list.size())}), src);
  const int64_t n = count.data_ptr<int64_t>()[0];
  if (rank() != src) sizes.assign(static_cast<size_t>(n), 0);
  const at::Tensor all_sizes = n > 0 ? detail::broadcast_host(*this, longs(sizes), src) : longs({});
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) total += all_sizes.data_ptr<int64_t>()[i];
  if (rank() != src) bytes = at::empty({total}, at::kByte);
  if (total > 0) bytes = detail::broadcast_host(*this, bytes, src);
  if (rank() == src) return;
  DDP_CHECK(object_list.size() == static_cast<size_t>(n), "broadcast_object_list: rank ", rank(),
            "'s object_list holds ", object_list.size(), " entries, but src (rank ", src, ") sent ",
            n, "; every rank passes a list of the same length.");
  split_into(bytes, all_sizes.data_ptr<int64_t>(), static_cast<size_t>(n), object_list);
}

void ProcessGroup::all_gather_object(std::vector<c10::IValue>& object_list,
                                     const c10::IValue& obj) {
  DDP_CHECK(object_list.size() == static_cast<size_t>(size()),
            "all_gather_object: object_list must hold one entry per rank (", size(),
            "), but holds ", object_list.size(), " on rank ", rank(), ".");
  const std::vector<char> mine = pickle(obj);
  const std::vector<std::string> all = all_gather_bytes(std::string(mine.begin(), mine.end()));
  for (size_t r = 0; r < all.size(); ++r) {
    object_list[r] = unpickle(reinterpret_cast<const uint8_t*>(all[r].data()),
                              static_cast<int64_t>(all[r].size()));
  }
}

void ProcessGroup::gather_object(const c10::IValue& obj,
                                 std::vector<c10::IValue>& object_gather_list, int dst) {
  DDP_CHECK(dst >= 0 && dst < size(), "gather_object's dst must be a rank of the group, 0..",
            size() - 1, ", but got ", dst, " on rank ", rank(), ".");
  if (rank() == dst) {
    DDP_CHECK(object_gather_list.size() == static_cast<size_t>(size()),
              "gather_object: object_gather_list must hold one entry per rank (", size(),
              ") on dst, but holds ", object_gather_list.size(), " on rank ", rank(), ".");
  } else {
    DDP_CHECK(object_gather_list.empty(),
              "gather_object: object_gather_list must be empty on "
              "the ranks other than dst (",
              dst, "), as Python's None, but holds ", object_gather_list.size(), " on rank ",
              rank(), ".");
  }
  detail::Comm& c = detail::comm_of(*this);
  std::vector<int64_t> my_size;
  const at::Tensor mine = concat({obj}, my_size);
  // Every length (all ranks need the longest), then the bytes padded to it.
  const at::Tensor lengths = detail::all_gather_host(*this, longs(my_size)).reshape({-1});
  const int64_t longest = std::max<int64_t>(lengths.max().item<int64_t>(), 1);
  at::Tensor padded = at::zeros({longest}, at::kByte);
  padded.narrow(0, 0, mine.numel()).copy_(mine);
  at::Tensor input = c.to_device(padded);
  std::vector<at::Tensor> rows;
  if (rank() == dst) {
    for (int r = 0; r < size(); ++r) rows.push_back(at::empty_like(input));
  }
  gather(input, rows, dst);
  if (rank() != dst) return;
  for (int r = 0; r < size(); ++r) {
    const at::Tensor host = c.to_host(rows[r]);
    object_gather_list[r] = unpickle(host.data_ptr<uint8_t>(), lengths.data_ptr<int64_t>()[r]);
  }
}

void ProcessGroup::scatter_object_list(std::vector<c10::IValue>& scatter_object_output_list,
                                       const std::vector<c10::IValue>& scatter_object_input_list,
                                       int src) {
  DDP_CHECK(src >= 0 && src < size(), "scatter_object_list's src must be a rank of the group, 0..",
            size() - 1, ", but got ", src, " on rank ", rank(), ".");
  DDP_CHECK(!scatter_object_output_list.empty(),
            "scatter_object_list: scatter_object_output_list "
            "must hold at least one entry (the first receives this rank's object), but is empty "
            "on rank ",
            rank(), ".");
  if (rank() == src) {
    DDP_CHECK(scatter_object_input_list.size() == static_cast<size_t>(size()),
              "scatter_object_list: scatter_object_input_list must hold one object per rank (",
              size(), ") on src, but holds ", scatter_object_input_list.size(), " on rank ", rank(),
              ".");
  }
  detail::Comm& c = detail::comm_of(*this);
  std::vector<int64_t> sizes;
  at::Tensor bytes;
  if (rank() == src) {
    bytes = concat(scatter_object_input_list, sizes);
  } else {
    sizes.assign(static_cast<size_t>(size()), 0);
  }
  const at::Tensor all_sizes = detail::broadcast_host(*this, longs(sizes), src);
  const int64_t* length = all_sizes.data_ptr<int64_t>();
  const int64_t longest = std::max<int64_t>(*std::max_element(length, length + size()), 1);
  std::vector<at::Tensor> parts;
  if (rank() == src) {
    int64_t at_byte = 0;
    for (int r = 0; r < size(); ++r) {
      at::Tensor part = at::zeros({longest}, at::kByte);
      part.narrow(0, 0, length[r]).copy_(bytes.narrow(0, at_byte, length[r]));
      at_byte += length[r];
      parts.push_back(c.to_device(part));
    }
  }
  at::Tensor mine = c.to_device(at::empty({longest}, at::kByte));
  scatter(mine, parts, src);
  const at::Tensor host = c.to_host(mine);
  scatter_object_output_list[0] = unpickle(host.data_ptr<uint8_t>(), length[rank()]);
}

void ProcessGroup::send_object_list(const std::vector<c10::IValue>& object_list, int dst) {
  DDP_CHECK(!object_list.empty(), "send_object_list got an empty list on rank ", rank(), ".");
  detail::Comm& c = detail::comm_of(*this);
  std::vector<int64_t> sizes;
  const at::Tensor bytes = concat(object_list, sizes);
  send(c.to_device(longs(sizes)), dst);
  if (bytes.numel() > 0) send(c.to_device(bytes), dst);
}

int ProcessGroup::recv_object_list(std::vector<c10::IValue>& object_list, std::optional<int> src) {
  DDP_CHECK(!object_list.empty(), "recv_object_list got an empty list on rank ", rank(),
            "; pass a list of the length the sender sends.");
  detail::Comm& c = detail::comm_of(*this);
  at::Tensor sizes = c.to_device(at::empty({static_cast<int64_t>(object_list.size())}, at::kLong));
  const int from = recv(sizes, src);
  const at::Tensor host_sizes = c.to_host(sizes);
  const int64_t total = host_sizes.sum().item<int64_t>();
  at::Tensor bytes = c.to_device(at::empty({total}, at::kByte));
  if (total > 0) recv(bytes, from);
  split_into(c.to_host(bytes), host_sizes.data_ptr<int64_t>(), object_list.size(), object_list);
  return from;
}

// ---- The same on a group, or the default one ----------------------------------------
// Note [Free functions take global ranks] (global_ranks.h).

using detail::global_rank_for;
using detail::group_or_default;
using detail::group_rank_for;

void broadcast_object_list(std::vector<c10::IValue>& object_list, int src,
                           const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->broadcast_object_list(
      object_list, group_rank_for(group, src, "ddp::broadcast_object_list", "src"));
}
void all_gather_object(std::vector<c10::IValue>& object_list, const c10::IValue& obj,
                       const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->all_gather_object(object_list, obj);
}
void gather_object(const c10::IValue& obj, std::vector<c10::IValue>& object_gather_list, int dst,
                   const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->gather_object(obj, object_gather_list,
                                         group_rank_for(group, dst, "ddp::gather_object", "dst"));
}
void scatter_object_list(std::vector<c10::IValue>& scatter_object_output_list,
                         const std::vector<c10::IValue>& scatter_object_input_list, int src,
                         const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->scatter_object_list(scatter_object_output_list,
                                               scatter_object_input_list,
                                               group_rank_for(group, src,
                                                              "ddp::scatter_object_list", "src"));
}
void send_object_list(const std::vector<c10::IValue>& object_list, int dst,
                      const std::shared_ptr<ProcessGroup>& group) {
  group_or_default(group)->send_object_list(object_list,
                                            group_rank_for(group, dst, "ddp::send_object_list",
                                                           "dst"));
}
int recv_object_list(std::vector<c10::IValue>& object_list, std::optional<int> src,
                     const std::shared_ptr<ProcessGroup>& group) {
  std::optional<int> from;
  if (src) from = group_rank_for(group, *src, "ddp::recv_object_list", "src");
  return global_rank_for(group, group_or_default(group)->recv_object_list(object_list, from));
}

}  // namespace ddp
