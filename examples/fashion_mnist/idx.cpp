#include "idx.h"

#include <ATen/ATen.h>
#include <zlib.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iomanip>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace fashion_mnist {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr int kNumClasses = 10;

// Every failure ends with the same advice: where good files come from.
[[noreturn]] void fail(const std::string& path, const std::string& what) {
  std::ostringstream msg;
  msg << "Fashion-MNIST file " << path << ": " << what << ".\n"
      << "  Install the data set with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu;"
      << " it goes to " << kDefaultDataDir << "; add --reinstall if it is damaged),\n"
      << "  or point --data-dir at a folder holding train-images-idx3-ubyte.gz,"
      << " train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz.";
  throw std::runtime_error(msg.str());
}

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

GzFile open_gz(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    fail(path, std::string("cannot open it (") + std::strerror(errno) + ")");
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  // gzopen also reads an uncompressed file transparently, so plain IDX files work too.
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) fail(path, std::string("cannot open it (") + std::strerror(errno) + ")");
  return GzFile(f);
}

// Reads exactly `len` bytes, or fails saying how many were there; `end`, when given, is
// where the whole part being read ends (for the message).
void read_exact(gzFile f, const std::string& path, void* out, size_t len, size_t offset,
                const char* what, size_t end = 0) {
  size_t done = 0;
  while (done < len) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(len - done, 1u << 30));
    const int n = gzread(f, static_cast<char*>(out) + done, chunk);
    if (n < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      std::ostringstream s;
      s << "corrupt gzip data while reading the " << what << " (" << (msg ? msg : "?") << ") after "
        << offset + done << " bytes";
      fail(path, s.str());
    }
    if (n == 0) {
      std::ostringstream s;
      s << "truncated: it should hold bytes " << offset << ".." << (end ? end : offset + len)
        << " (the " << what << "), but its data end after " << offset + done << " bytes";
      fail(path, s.str());
    }
    done += static_cast<size_t>(n);
  }
}

// The `len` bytes of the payload, read in pieces so that memory grows with the data that
// is really there, not with what the header claims: a 20-byte file that announces 4e9
// labels is refused as truncated after reading it, without a 4 GB allocation first.
std::vector<uint8_t> read_payload(gzFile f, const std::string& path, size_t len, size_t offset,
                                  const char* what) {
  constexpr size_t kFirstPiece = size_t(64) << 10;
  std::vector<uint8_t> out;
  while (out.size() < len) {
    const size_t done = out.size();
    // Pieces double with what was read: at most twice the data there is, in few reads.
    const size_t piece = std::min(len - done, std::max(kFirstPiece, done));
    out.resize(done + piece);
    read_exact(f, path, out.data() + done, piece, offset + done, what, offset + len);
  }
  return out;
}

uint32_t read_be32(gzFile f, const std::string& path, size_t offset, const char* what) {
  unsigned char b[4];
  read_exact(f, path, b, 4, offset, what);
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
}

void expect_magic(uint32_t magic, uint32_t expected, const std::string& path) {
  if (magic == expected) return;
  std::ostringstream s;
  s << "not an IDX " << (expected == kImagesMagic ? "image" : "label") << " file: magic number 0x"
    << std::hex << std::setw(8) << std::setfill('0') << magic << ", expected 0x" << std::setw(8)
    << expected;
  fail(path, s.str());
}

// After the payload the file must end: trailing bytes mean a header that lies.
void expect_end(gzFile f, const std::string& path, size_t size) {
  char extra;
  const int n = gzread(f, &extra, 1);
  if (n > 0) {
    std::ostringstream s;
    s << "longer than its header says (" << size << " bytes expected)";
    fail(path, s.str());
  }
  if (n < 0) {
    int code = 0;
    fail(path, std::string("corrupt gzip data at its end (") + gzerror(f, &code) + ")");
  }
}

}  // namespace

at::Tensor read_idx_images(const std::string& path) {
  GzFile f = open_gz(path);
  expect_magic(read_be32(f.get(), path, 0, "header"), kImagesMagic, path);
  const uint32_t n = read_be32(f.get(), path, 4, "header");
  const uint32_t rows = read_be32(f.get(), path, 8, "header");
  const uint32_t cols = read_be32(f.get(), path, 12, "header");
  if (n == 0 || rows != 28 || cols != 28) {
    std::ostringstream s;
    s << "header says " << n << " images of " << rows << "x" << cols
      << ", expected at least one image of 28x28";
    fail(path, s.str());
  }
  const size_t len = size_t(n) * rows * cols;
  const std::vector<uint8_t> pixels = read_payload(f.get(), path, len, 16, "pixels");
  expect_end(f.get(), path, 16 + len);
  at::Tensor images = at::empty({int64_t(n), int64_t(rows), int64_t(cols)}, at::kByte);
  std::memcpy(images.data_ptr<uint8_t>(), pixels.data(), len);
  return images;
}

at::Tensor read_idx_labels(const std::string& path) {
  GzFile f = open_gz(path);
  expect_magic(read_be32(f.get(), path, 0, "header"), kLabelsMagic, path);
  const uint32_t n = read_be32(f.get(), path, 4, "header");
  if (n == 0) fail(path, "header says 0 labels");
  std::vector<uint8_t> bytes = read_payload(f.get(), path, n, 8, "labels");
  expect_end(f.get(), path, 8 + size_t(n));
  for (uint32_t i = 0; i < n; ++i) {
    if (bytes[i] >= kNumClasses) {
      std::ostringstream s;
      s << "label " << i << " is " << int(bytes[i]) << ", expected 0.." << kNumClasses - 1;
      fail(path, s.str());
    }
  }
  return at::from_blob(bytes.data(), {int64_t(n)}, at::kByte).to(at::kLong);
}

Split load_split(const std::string& dir, bool train, int64_t max_samples) {
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  const std::string images_path = prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = prefix + "-labels-idx1-ubyte.gz";
  Split split{read_idx_images(images_path), read_idx_labels(labels_path)};
  if (split.images.size(0) != split.labels.size(0)) {
    std::ostringstream s;
    s << "has " << split.labels.size(0) << " labels but " << images_path << " has "
      << split.images.size(0) << " images; the two files must come from the same release";
    fail(labels_path, s.str());
  }
  if (max_samples > 0 && max_samples < split.size()) {
    split.images = split.images.narrow(0, 0, max_samples).contiguous();
    split.labels = split.labels.narrow(0, 0, max_samples).contiguous();
  }
  return split;
}

at::Tensor normalize(const at::Tensor& images) {
  return images.to(at::kFloat).div_(255.0).sub_(kMean).div_(kStd).unsqueeze(1);
}

}  // namespace fashion_mnist
