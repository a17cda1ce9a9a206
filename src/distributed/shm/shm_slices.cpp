#include "distributed/shm/shm_transport.h"

#include "distributed/shm/shm_internal.h"
#include "distributed/shm/shm_kernels.h"
#include "distributed/shm/shm_layout.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>

namespace ddp {
namespace detail {
namespace shm {

// Note [Zero-copy buffers]: one unit of three phases, like a slice, so that the slot
// bookkeeping of run() holds across both kinds of collectives; the slot carries only the
// description of the call, no data.
void Transport::enter_unit(const Call& call) {
  begin_call();
  Control& mine = control_of(base_, options_.rank);
  const int slot = static_cast<int>(slices_ & 1);
  if (slices_ >= 2) wait_all(step_ - 3, call, "slot reuse");
  mine.call[slot].store(call.code(), std::memory_order_relaxed);
  mine.bytes[slot].store(call.bytes, std::memory_order_relaxed);
  mine.offset[slot].store(call.offset, std::memory_order_relaxed);
  // A: this rank's input is in place (its writes happen before this release).
  publish();
  wait_all(step_, call, "A");
  check_same_call(call, slot);
}

void Transport::leave_unit(const Call& call) {
  publish();  // B: this rank's partition is done
  // Every partition is in this rank's buffer once every rank has published B; after that
  // no rank touches another's buffer for this call.
  wait_all(step_, call, "B");
  publish();  // C
  ++slices_;
}

std::pair<size_t, size_t> Transport::partition(size_t elems, size_t esize) const {
  const size_t n = static_cast<size_t>(options_.world_size);
  const size_t line = std::max<size_t>(1, kLine / esize);  // partitions are whole lines
  const size_t chunk = round_up((elems + n - 1) / n, line);
  const size_t begin = std::min(elems, chunk * static_cast<size_t>(options_.rank));
  return {begin, std::min(elems, begin + chunk)};
}

void Transport::run_in_pool(const Call& call) {
  const int n = options_.world_size;
  const int me = options_.rank;
  const size_t esize = dtype_size(call.dtype);
  enter_unit(call);

  // B: partition `me` reduced over every rank's buffer, in rank order, into all of them.
  const auto [begin, end] = partition(call.bytes / esize, esize);
  if (begin < end) {
    copies_.clear();
    for (int r = 0; r < n; ++r) {
      inputs_[static_cast<size_t>(r)] = call.pool->part(r) + call.offset;
      if (r != me) copies_.push_back(call.pool->part(r) + call.offset);
    }
    reduce(call.dtype, call.op, call.pool->part(me) + call.offset, copies_.data(),
           static_cast<int>(copies_.size()), inputs_.data(), n, begin, end);
  }
  leave_unit(call);
}

void Transport::run(const Call& call) {
  const int n = options_.world_size;
  const int me = options_.rank;
  const size_t slice = options_.slice_bytes;
  const size_t esize = call.kind == Kind::kAllReduce ? dtype_size(call.dtype) : 1;
  // all_reduce slices hold whole elements; the partitions of a slice are whole cache lines.
  const size_t per_slice = call.kind == Kind::kAllReduce ? slice / esize * esize : slice;
  const size_t slices = std::max<size_t>(1, (call.bytes + per_slice - 1) / per_slice);
  begin_call();

  Control& mine = control_of(base_, me);
  for (size_t s = 0; s < slices; ++s, ++slices_) {
    const int slot = static_cast<int>(slices_ & 1);
    const size_t offset = s * per_slice;
    const size_t len = std::min(per_slice, call.bytes - std::min(call.bytes, offset));
    // The slot is free once every rank has copied out the slice that used it last.
    if (slices_ >= 2) wait_all(step_ - 3, call, "slot reuse");

    // A: this rank's bytes in.
    if (s == 0) {
      mine.call[slot].store(call.code(), std::memory_order_relaxed);
      mine.bytes[slot].store(call.bytes, std::memory_order_relaxed);
      mine.offset[slot].store(0, std::memory_order_relaxed);
    }
    unsigned char* my_in = input_area(slot, me);
    unsigned char* my_data =
        call.data != nullptr ? static_cast<unsigned char*>(call.data) + offset : nullptr;
    // all_reduce: this rank's partition of the slice, [part_begin, part_end) in elements.
    // Partitions are whole cache lines.
    size_t part_begin = 0, part_end = 0;
    if (call.kind == Kind::kAllReduce)
      std::tie(part_begin, part_end) = partition(len / esize, esize);
    // (An empty tensor's data pointer may be null: memcpy must not see it, even for 0 bytes.)
    if (call.kind == Kind::kAllReduce) {
      // Only what the peers reduce: this rank reads its own partition from its own buffer.
      if (part_begin > 0) std::memcpy(my_in, my_data, part_begin * esize);
      if (len > part_end * esize)
        std::memcpy(my_in + part_end * esize, my_data + part_end * esize, len - part_end * esize);
    } else if (call.kind == Kind::kBroadcast && me == call.root && len > 0) {
      std::memcpy(my_in, static_cast<const unsigned char*>(call.data) + offset, len);
    } else if (call.kind == Kind::kAllGather && len > 0) {
      std::memcpy(my_in, static_cast<const unsigned char*>(call.input) + offset, len);
    }
    publish();
    wait_all(step_, call, "A");
    if (s == 0) check_same_call(call, slot);

    // B: this rank's partition reduced, in rank order.
    // The result goes to the result area, for the peers, and straight into this rank's
    // own buffer.
    if (call.kind == Kind::kAllReduce) {
      if (part_begin < part_end) {
        for (int r = 0; r < n; ++r) {
          inputs_[static_cast<size_t>(r)] = r == me ? my_data : input_area(slot, r);
        }
        void* own = my_data;
        reduce(call.dtype, call.op, result_area(slot), &own, 1, inputs_.data(), n, part_begin,
               part_end);
      }
      publish();
      wait_all(step_, call, "B");
    } else {
      publish();
    }

    // C: the result out.
    if (call.kind == Kind::kAllReduce) {
      const unsigned char* result = result_area(slot);
      if (part_begin > 0) std::memcpy(my_data, result, part_begin * esize);
      if (len > part_end * esize)
        std::memcpy(my_data + part_end * esize, result + part_end * esize, len - part_end * esize);
    } else if (call.kind == Kind::kBroadcast && me != call.root && len > 0) {
      std::memcpy(static_cast<unsigned char*>(call.data) + offset, input_area(slot, call.root),
                  len);
    } else if (call.kind == Kind::kAllGather && len > 0) {
      for (int r = 0; r < n; ++r) {
        std::memcpy(static_cast<unsigned char*>((*call.outputs)[static_cast<size_t>(r)]) + offset,
                    input_area(slot, r), len);
      }
    }
    publish();
  }
}

void Transport::all_reduce(void* data, size_t count, DType dtype, Op op) {
  Call call = Call::reduction(Kind::kAllReduce, count, dtype, op);
  call.data = data;
  run(call);
}

void Transport::all_reduce_in_pool(const SharedPool& pool, size_t offset, size_t count, DType dtype,
                                   Op op) {
  Call call = Call::reduction(Kind::kAllReduceInPool, count, dtype, op);
  call.offset = offset;
  call.pool = &pool;
  if (offset > pool.bytes_per_rank() || call.bytes > pool.bytes_per_rank() - offset) {
    throw std::invalid_argument("all_reduce_in_pool: " + std::to_string(call.bytes) +
                                " bytes at offset " + std::to_string(offset) +
                                " do not fit a pool part of " +
                                std::to_string(pool.bytes_per_rank()) + " bytes");
  }
  run_in_pool(call);
}

void Transport::broadcast(void* data, size_t bytes, int root) {
  Call call;
  call.kind = Kind::kBroadcast;
  call.root = root;
  call.bytes = bytes;
  call.data = data;
  run(call);
}

void Transport::all_gather(const void* input, size_t bytes, const std::vector<void*>& outputs) {
  Call call;
  call.kind = Kind::kAllGather;
  call.bytes = bytes;
  call.input = input;
  call.outputs = &outputs;
  run(call);
}

void Transport::barrier() {
  Call call;
  call.kind = Kind::kBarrier;
  run(call);
}

}  // namespace shm
}  // namespace detail
}  // namespace ddp
