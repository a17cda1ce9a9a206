#include "support/util.h"

#include <ddp/distributed/process_group.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

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

bool same_value(const c10::IValue& a, const c10::IValue& b, const std::string& path,
                std::string* diff) {
  auto differ = [&](const std::string& what) {
    *diff = path + ": " + what;
    return false;
  };
  if (a.isTensor() && b.isTensor()) {
    return same_bits(a.toTensor(), b.toTensor()) ? true : differ("tensors differ");
  }
  if (a.isGenericDict() && b.isGenericDict()) {
    const auto da = a.toGenericDict(), db = b.toGenericDict();
    if (da.size() != db.size()) return differ("sizes differ");
    for (const auto& e : da) {
      const auto it = db.find(e.key());
      if (it == db.end()) return differ("key missing");
      const std::string key =
          e.key().isString() ? e.key().toStringRef() : std::to_string(e.key().toInt());
      if (!same_value(e.value(), it->value(), path + "." + key, diff)) return false;
    }
    return true;
  }
  if (a.isList() && b.isList()) {
    const auto la = a.toList(), lb = b.toList();
    if (la.size() != lb.size()) return differ("lengths differ");
    for (size_t i = 0; i < la.size(); ++i) {
      if (!same_value(la.get(i), lb.get(i), path + "[" + std::to_string(i) + "]", diff))
        return false;
    }
    return true;
  }
  std::ostringstream sa, sb;
  sa << a;
  sb << b;
  return sa.str() == sb.str() ? true : differ(sa.str() + " vs " + sb.str());
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous().cpu();
  const at::Tensor cb = b.contiguous().cpu();
  // An empty tensor's data pointer may be null, which memcmp must not be given even for
  // zero bytes (UBSan's report).
  return ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
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
