// ddp::cpu_memory_stats, the counting CPU allocator and the caching one
// (include/ddp/distributed/memory.h). Each runs in a process of its own (a scenario):
// both allocators are process-wide, and the counts must start from a known state.

#include "support/harness.h"
#include "support/util.h"

#include <ddp/distributed/memory.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

// Its own namespace, so that names local to this file stay apart from other files'
// in a unity unit (cmake/ddpBuildSpeed.cmake).
namespace cpu_memory_test {

namespace {
constexpr int64_t kMiB = 1 << 20;

/// These scenarios run without a process group, so not ddp_test::fail (which names the
/// rank).
int fail(const std::string& what) {
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  return 1;
}
}  // namespace

// Counting: a tensor's bytes appear in `allocated` and its peak, and leave when it dies;
// the RSS grows by at least what was touched.
DDP_SCENARIO(cpu_memory_counting) {
  if (ddp::cpu_memory_stats().allocated != -1)
    return fail("allocated should be -1 before counting");
  ddp::enable_cpu_allocation_counting();
  ddp::enable_cpu_allocation_counting();  // idempotent
  if (!ddp::cpu_allocation_counting_enabled()) return fail("counting did not start");
  ddp::reset_peak_cpu_memory_stats();
  const ddp::CpuMemoryStats before = ddp::cpu_memory_stats();
  {
    at::Tensor t = at::ones({16 * kMiB / 4});  // 16 MiB, every page touched
    const ddp::CpuMemoryStats during = ddp::cpu_memory_stats();
    if (during.allocated - before.allocated != 16 * kMiB) {
      return fail("allocated grew by " + std::to_string(during.allocated - before.allocated) +
                  ", expected 16 MiB");
    }
    if (during.rss - before.rss < 15 * kMiB) return fail("RSS did not grow with the tensor");
    at::Tensor u = t + 1;  // a kernel's output: counted too
    if (ddp::cpu_memory_stats().allocated - before.allocated != 32 * kMiB) {
      return fail("a kernel's output was not counted");
    }
  }
  const ddp::CpuMemoryStats after = ddp::cpu_memory_stats();
  if (after.allocated != before.allocated) return fail("the tensors' bytes did not leave");
  // 32 MiB, and the few bytes of the scalar `1` that the addition wraps in a tensor.
  const int64_t peak = after.peak_allocated - before.allocated;
  if (peak < 32 * kMiB || peak > 32 * kMiB + 4096) {
    return fail("peak_allocated is " + std::to_string(peak) + " above the start, expected 32 MiB");
  }
  ddp::reset_peak_cpu_memory_stats();
  if (ddp::cpu_memory_stats().peak_allocated != after.allocated) {
    return fail("reset_peak_cpu_memory_stats did not restart the peak");
  }
  if (after.peak_rss < after.rss) return fail("peak_rss is below rss");
  std::printf("counting ok\n");
  return 0;
}

// Caching: a large tensor's memory is cached when it dies and reused by the next of its
// size; small ones are not; release_free_cpu_memory empties the cache.
DDP_SCENARIO(cpu_memory_caching) {
  if (!ddp::enable_cpu_caching_allocator()) return fail("the caching allocator could not start");
  if (!ddp::cpu_caching_allocator_enabled()) return fail("caching is not reported on");
  const ddp::CpuMemoryStats start = ddp::cpu_memory_stats();
  const void* first = nullptr;
  {
    at::Tensor t = at::empty({8 * kMiB / 4});
    first = t.data_ptr();
  }
  const ddp::CpuMemoryStats cached = ddp::cpu_memory_stats();
  if (cached.buffers_cached - start.buffers_cached < 8 * kMiB) {
    return fail("a dead 8 MiB tensor was not cached");
  }
  {
    at::Tensor t = at::empty({8 * kMiB / 4});
    if (t.data_ptr() != first) return fail("the next tensor of the same size got other memory");
    if (ddp::cpu_memory_stats().buffers_cached >= cached.buffers_cached) {
      return fail("taking the cached block did not leave the cache");
    }
    t.fill_(2);
    if (t.sum().item<double>() != 2.0 * (8 * kMiB / 4)) return fail("the reused memory is wrong");
  }
  {
    at::Tensor small = at::empty({1024});  // 4 KiB: glibc's, not the cache's
    (void)small;
  }
  if (ddp::cpu_memory_stats().buffers_cached != cached.buffers_cached) {
    return fail("a small tensor went through the cache");
  }
  ddp::release_free_cpu_memory();
  if (ddp::cpu_memory_stats().buffers_cached != 0) return fail("release left blocks cached");
  std::printf("caching ok\n");
  return 0;
}

TEST(CpuMemoryTest, CountingFollowsEveryTensor) {
  ddp_test::ProcessOptions o;
  o.launcher_env = false;
  const auto results = ddp_test::run_processes(1, "cpu_memory_counting", o);
  ddp_test::expect_all_ok(results);
  EXPECT_NE(results[0].output.find("counting ok"), std::string::npos) << results[0].output;
}

TEST(CpuMemoryTest, CachingReusesLargeBlocks) {
  ddp_test::ProcessOptions o;
  o.launcher_env = false;
  const auto results = ddp_test::run_processes(1, "cpu_memory_caching", o);
  ddp_test::expect_all_ok(results);
  EXPECT_NE(results[0].output.find("caching ok"), std::string::npos) << results[0].output;
}

}  // namespace cpu_memory_test
