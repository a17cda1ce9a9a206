#pragma once

// Large transient host buffers, reused: fully_shard's all-gather outputs, full parameters
// and reduce-scatter buffers (Note [Host blocks], host_blocks.cpp).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <utility>

namespace ddp {
namespace detail {

/// `bytes` bytes on `device`, owned by this object and given back when it is destroyed
/// or reset(). On the CPU the memory comes from the pool and tensor() does not own it:
/// a view that outlives the block must not be used (a collective's lingering reference,
/// after its wait, is harmless). Elsewhere it is a plain at::empty (the device's caching
/// allocator reuses it) that tensor() owns.
class HostBlock {
 public:
  HostBlock() = default;
  HostBlock(int64_t bytes, c10::Device device);
  ~HostBlock() { reset(); }
  HostBlock(HostBlock&& other) noexcept { *this = std::move(other); }
  HostBlock& operator=(HostBlock&& other) noexcept;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;

  bool defined() const { return tensor_.defined(); }
  /// A 1-D uint8 tensor over the block's `bytes` bytes.
  const at::Tensor& tensor() const { return tensor_; }
  /// Gives the block back now.
  void reset();
  /// Never gives it back: a collective that failed may still touch it.
  void keep_for_good();

 private:
  at::Tensor tensor_;
  void* data_ = nullptr;  // the pool's block (CPU only)
  int64_t size_ = 0;
};

/// The pool's memory without a tensor, for the caching CPU allocator (cpu_memory.cpp): at
/// least `bytes` bytes, and the size to give back with it.
std::pair<void*, int64_t> take_host_memory(int64_t bytes);
void give_host_memory(void* data, int64_t size);

struct HostBlockStats {
  int64_t in_use = 0;          // bytes of HostBlocks handed out and not back yet
  int64_t tensors_in_use = 0;  // bytes of LibTorch's tensors (the caching allocator's)
  int64_t cached = 0;          // bytes kept for the next take
  int64_t peak_in_use = 0;     // the largest in_use since the start or the last reset
  int64_t maps = 0;            // blocks mapped from the system so far
};
HostBlockStats host_block_stats();

/// Returns every cached block to the system (the pool's bound starts afresh).
void release_host_blocks();
/// Starts peak_in_use afresh from in_use (the pool keeps what it caches).
void reset_host_block_peak();

}  // namespace detail
}  // namespace ddp
