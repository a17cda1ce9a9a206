#pragma once

// The character-level corpus of examples/gpt.cpp: a UTF-8 text file read whole, its
// characters (Unicode code points) as tokens, split 90/10 into training and validation
// text, each cut into windows of block_size + 1 tokens (inputs and the next-character
// targets) that start every block_size characters. The Python twin (gpt.py) reads a
// file the same way, so both see the same tokens and the same windows.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gpt {

/// Where the default corpus is: Debian's fortunes package (scripts/install-deps).
inline constexpr const char* kDefaultCorpus = "/usr/share/games/fortunes/songs-poems";

/// The windows of one part of the text.
struct Windows {
  at::Tensor tokens;  // int64 [n]
  int64_t block_size = 0;

  /// Windows starting every block_size tokens that fit whole: (n - 1) / block_size.
  int64_t size() const;
  /// Inputs and targets, int64 [indices.size(), block_size] each.
  std::pair<at::Tensor, at::Tensor> batch(const std::vector<size_t>& indices) const;
  /// Windows [begin, end), in order.
  std::pair<at::Tensor, at::Tensor> range(int64_t begin, int64_t end) const;
};

struct Corpus {
  std::string path;
  int64_t characters = 0;            // after truncation
  std::vector<char32_t> vocabulary;  // the distinct code points, ascending; id = position
  Windows train, validation;

  std::vector<int64_t> encode(const std::string& utf8) const;  // throws on unknown characters
  std::string decode(const std::vector<int64_t>& ids) const;
};

/// Reads `path` as UTF-8 and keeps its first `truncate` (0, 1] of the characters.
/// Throws an error that names the file and says what to do when it is missing,
/// unreadable, empty, not UTF-8, or too short to give one training and one validation
/// window of block_size + 1 characters.
Corpus load_corpus(const std::string& path, double truncate, double train_split,
                   int64_t block_size);

}  // namespace gpt
