#pragma once

// Fashion-MNIST from gzip-compressed IDX files, read with zlib.
//
// IDX is the format of LeCun's MNIST files: a big-endian header (magic number, then one
// 32-bit size per dimension) followed by the raw bytes. Debian's dataset-fashion-mnist
// package installs the four files of Zalando's release in /usr/share/datasets/fashion-mnist.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace fashion_mnist {

/// Where Debian's dataset-fashion-mnist package puts the files.
constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

/// Fashion-MNIST's per-pixel mean and standard deviation (pixels scaled to [0, 1]).
constexpr double kMean = 0.2860;
constexpr double kStd = 0.3530;

/// One split: images as uint8 [N, 28, 28], labels as int64 [N] in 0..9.
struct Split {
  at::Tensor images;
  at::Tensor labels;
  int64_t size() const { return labels.size(0); }
};

/// Reads an IDX image file (magic 0x00000803): uint8 [N, rows, cols]. Throws
/// std::runtime_error naming the file, what was wrong and how to get a good copy.
at::Tensor read_idx_images(const std::string& path);

/// Reads an IDX label file (magic 0x00000801): int64 [N], each in 0..9.
at::Tensor read_idx_labels(const std::string& path);

/// Reads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz. `max_samples` > 0 keeps
/// only the first max_samples of the split (for quick runs); 0 keeps all.
Split load_split(const std::string& dir, bool train, int64_t max_samples = 0);

/// uint8 images [B, 28, 28] -> normalised float [B, 1, 28, 28]: (x / 255 - mean) / std.
at::Tensor normalize(const at::Tensor& images);

}  // namespace fashion_mnist
