#pragma once

// Small helpers that several test files need: text, the environment, this binary,
// tensors compared bit for bit, tensors in files for Python peers, a scenario's failure, and EXPECT_ERROR_HAS.

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <gtest/gtest.h>

#include <string>

namespace ddp_test {

/// Whether `part` occurs in `text`.
bool contains(const std::string& text, const std::string& part);

/// Environment variable `name`, or `fallback` when it is unset or empty.
std::string env_or(const char* name, const std::string& fallback);

/// The path of this test binary (/proc/self/exe resolved), or "" when unreadable.
std::string self_exe();

/// Same dtype, shape and bytes: bit-identical, unlike at::equal for -0.0 and NaN.
/// Either tensor may be non-contiguous or on a device.
bool same_bits(const at::Tensor& a, const at::Tensor& b);

/// Whether two unpickled values (tensors, dicts, lists, scalars, nested) are the same,
/// tensors bit for bit; when not, *diff names the first difference under `path`.
bool same_value(const c10::IValue& a, const c10::IValue& b, const std::string& path,
                std::string* diff);

/// The largest absolute difference of `a` and `b` (in double), for failure messages.
double max_diff(const at::Tensor& a, const at::Tensor& b);

/// Writes `t`'s bytes (contiguous, from the CPU, in its own dtype) to `path`, for a
/// Python peer to read with numpy or torch.frombuffer. Throws if the write fails.
void write_bytes(const std::string& path, const at::Tensor& t);
/// write_bytes of `t` as float32.
void write_floats(const std::string& path, const at::Tensor& t);
/// Reads float32 values of shape `sizes` from `path`; throws on a short file.
at::Tensor read_floats(const std::string& path, at::IntArrayRef sizes);

/// For a scenario (DDP_SCENARIO): prints "rank R: what" on stderr and returns 1, its
/// exit code.
int fail(const std::string& what);

}  // namespace ddp_test

/// Expects error text `message` to contain `fragment`, showing both otherwise.
#define EXPECT_ERROR_HAS(message, fragment)                         \
  EXPECT_NE(std::string(message).find(fragment), std::string::npos) \
      << "expected to find: " << (fragment) << "\n in: " << (message)
