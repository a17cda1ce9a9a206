#include "support/util.h"

#include <ddp/distributed/process_group.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace ddp_test {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous().cpu();
  const at::Tensor cb = b.contiguous().cpu();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

void write_bytes(const std::string& path, const at::Tensor& t) {
  const at::Tensor c = t.detach().contiguous().cpu();
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  TORCH_CHECK(f.good(), "cannot write ", path);
}

void write_floats(const std::string& path, const at::Tensor& t) {
  write_bytes(path, t.detach().to(at::kFloat));
}

at::Tensor read_floats(const std::string& path, at::IntArrayRef sizes) {
  at::Tensor t = at::empty(sizes, at::kFloat);
  std::ifstream f(path, std::ios::binary);
  f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  TORCH_CHECK(f.gcount() == static_cast<std::streamsize>(t.nbytes()), "short read from ", path);
  return t;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", ddp::get_rank(), what.c_str());
  return 1;
}

}  // namespace ddp_test
