// Fuzz target: the GPT example's corpus reader, load_corpus in examples/gpt/text.{h,cpp}
// (UTF-8 into a character vocabulary and token windows; ATen, libtorch_cpu).
//
// The input is written to a file (fuzz_check.h) and loaded with a block size of 4. A
// refusal must be a std::runtime_error or c10::Error naming the file. What is accepted
// must be consistent: the vocabulary ascending and distinct, every token an index into
// it, the windows fitting, and decode then encode giving back the tokens.
#include "gpt/text.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ddp_fuzz::input_file("corpus.txt", data, size);
  gpt::Corpus corpus;
  try {
    corpus = gpt::load_corpus(path, 1.0, 0.8, 4);
  } catch (const std::exception& e) {
    ddp_fuzz::expect_names_file(e, path);
    return 0;
  }
  const auto& v = corpus.vocabulary;
  FUZZ_CHECK(!v.empty() &&
                 std::adjacent_find(v.begin(), v.end(),
                                    [](char32_t a, char32_t b) { return a >= b; }) == v.end(),
             "the vocabulary is not ascending and distinct");
  for (const gpt::Windows* w : {&corpus.train, &corpus.validation}) {
    FUZZ_CHECK(w->tokens.dim() == 1 && w->tokens.scalar_type() == at::kLong, "tokens' type");
    FUZZ_CHECK(w->size() >= 1, "a part without one window");
    const int64_t n = w->tokens.numel();
    FUZZ_CHECK(w->tokens.min().item<int64_t>() >= 0 &&
                   w->tokens.max().item<int64_t>() < static_cast<int64_t>(v.size()),
               "a token outside the vocabulary");
    const auto [x, y] = w->range(0, w->size());
    FUZZ_CHECK(x.size(0) == w->size() && x.size(1) == 4 && y.sizes() == x.sizes(),
               "windows of another shape");
    const at::Tensor head = w->tokens.slice(0, 0, std::min<int64_t>(n, 64)).contiguous();
    const std::vector<int64_t> ids(head.data_ptr<int64_t>(),
                                   head.data_ptr<int64_t>() + head.numel());
    FUZZ_CHECK(corpus.encode(corpus.decode(ids)) == ids, "decode then encode changed tokens");
  }
  return 0;
}
