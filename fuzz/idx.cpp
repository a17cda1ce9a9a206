// Fuzz target: the IDX readers of the Fashion-MNIST example, examples/fashion_mnist/idx.cpp
// (zlib for .gz, which also reads plain files; ATen for the tensors, libtorch_cpu).
//
// The input is written to a file (fuzz_check.h) and read as images and as labels. A
// refusal must be a std::runtime_error naming the file. What is accepted must be what the
// header promises: images uint8 [N, rows, cols], labels int64 [N] each in 0..9.
#include "fashion_mnist/idx.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ddp_fuzz::input_file("input-idx-ubyte", data, size);
  try {
    const at::Tensor images = fashion_mnist::read_idx_images(path);
    FUZZ_CHECK(images.dim() == 3 && images.scalar_type() == at::kByte,
               "images of another shape or type");
  } catch (const std::runtime_error& e) {
    ddp_fuzz::expect_names_file(e, path);
  }
  try {
    const at::Tensor labels = fashion_mnist::read_idx_labels(path);
    FUZZ_CHECK(labels.dim() == 1 && labels.scalar_type() == at::kLong, "labels of another shape");
    if (labels.numel() > 0) {
      FUZZ_CHECK(labels.min().item<int64_t>() >= 0 && labels.max().item<int64_t>() <= 9,
                 "a label outside 0..9");
    }
  } catch (const std::runtime_error& e) {
    ddp_fuzz::expect_names_file(e, path);
  }
  return 0;
}
