#include "text.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <unordered_map>

namespace gpt {
namespace {

std::string hex_byte(unsigned char c) {
  static const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[c >> 4] + digits[c & 15];
}

// Strict UTF-8 (no overlong forms, no surrogates), as Python's bytes.decode("utf-8").
std::vector<char32_t> decode_utf8(const std::string& bytes, const std::string& what) {
  std::vector<char32_t> out;
  out.reserve(bytes.size());
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    int extra = 0;
    char32_t cp = 0, min = 0;
    if (c < 0x80) {
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, cp = c & 0x07, min = 0x10000;
    } else {
      extra = -1;
    }
    bool ok = extra >= 0;
    for (int k = 1; ok && k <= extra; ++k) {
      if (i + k >= n) {
        ok = false;
        break;
      }
      const auto d = static_cast<unsigned char>(bytes[i + k]);
      if ((d & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (d & 0x3F);
    }
    ok = ok && cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    TORCH_CHECK(ok, what, " is not UTF-8 text: invalid byte ", hex_byte(c), " at byte offset ", i,
                ". Give a UTF-8 (or plain ASCII) text file; convert another encoding first, "
                "e.g. iconv -f latin1 -t utf-8 IN > OUT");
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

int64_t Windows::size() const {
  const int64_t n = tokens.defined() ? tokens.numel() : 0;
  return n < 1 ? 0 : (n - 1) / block_size;
}

std::pair<at::Tensor, at::Tensor> Windows::batch(const std::vector<size_t>& indices) const {
  std::vector<int64_t> starts;
  starts.reserve(indices.size());
  for (size_t i : indices) {
    TORCH_CHECK(static_cast<int64_t>(i) < size(), "window ", i, " of ", size());
    starts.push_back(static_cast<int64_t>(i) * block_size);
  }
  const at::Tensor offsets =
      at::tensor(starts, at::kLong).unsqueeze(1) + at::arange(block_size + 1, at::kLong);
  const at::Tensor chunks = tokens.index_select(0, offsets.reshape({-1})).view(offsets.sizes());
  return {chunks.narrow(1, 0, block_size).contiguous(),
          chunks.narrow(1, 1, block_size).contiguous()};
}

std::pair<at::Tensor, at::Tensor> Windows::range(int64_t begin, int64_t end) const {
  std::vector<size_t> indices;
  for (int64_t i = begin; i < end; ++i) indices.push_back(static_cast<size_t>(i));
  return batch(indices);
}

std::vector<int64_t> Corpus::encode(const std::string& utf8) const {
  std::vector<int64_t> ids;
  for (char32_t cp : decode_utf8(utf8, "--prompt")) {
    auto it = std::lower_bound(vocabulary.begin(), vocabulary.end(), cp);
    char name[16];
    std::snprintf(name, sizeof(name), "U+%04X", static_cast<unsigned>(cp));
    TORCH_CHECK(it != vocabulary.end() && *it == cp, "the character ", name,
                " of --prompt is not in the corpus ", path, " (", vocabulary.size(),
                " distinct characters): use characters of the text");
    ids.push_back(it - vocabulary.begin());
  }
  return ids;
}

std::string Corpus::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) append_utf8(vocabulary.at(static_cast<size_t>(id)), out);
  return out;
}

Corpus load_corpus(const std::string& path, double truncate, double train_split,
                   int64_t block_size) {
  TORCH_CHECK(truncate > 0 && truncate <= 1, "--truncate must be in (0, 1], got ", truncate);
  TORCH_CHECK(train_split > 0 && train_split < 1, "--train-split must be in (0, 1), got ",
              train_split);
  std::ifstream file(path, std::ios::binary);
  TORCH_CHECK(file.is_open(), "cannot open --data ", path, ": ", std::strerror(errno),
              ". The default corpus comes with Debian's fortunes package (scripts/install-deps "
              "installs it); or pass --data with any UTF-8 text file");
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  TORCH_CHECK(!file.bad(), "cannot read --data ", path, ": ", std::strerror(errno));
  TORCH_CHECK(!bytes.empty(), "--data ", path, " is empty: give a UTF-8 text file");
  std::vector<char32_t> text = decode_utf8(bytes, "--data " + path);
  const auto keep = static_cast<size_t>(std::floor(double(text.size()) * truncate));
  text.resize(std::min(text.size(), keep));

  // The split, and what it needs: one window of block_size + 1 characters on each side.
  const auto n = static_cast<int64_t>(text.size());
  const auto train_len = static_cast<int64_t>(std::floor(double(n) * train_split));
  const int64_t need = block_size + 1;
  TORCH_CHECK(train_len >= need && n - train_len >= need, "--data ", path, " has ", n,
              " characters", truncate < 1 ? " after --truncate" : "", "; with --train-split ",
              train_split, " that is ", train_len, " for training and ", n - train_len,
              " for validation, and each needs at least block_size + 1 = ", need,
              ". Give a longer text, or a smaller --block-size");

  Corpus corpus;
  corpus.path = path;
  corpus.characters = n;
  corpus.vocabulary = text;
  std::sort(corpus.vocabulary.begin(), corpus.vocabulary.end());
  corpus.vocabulary.erase(std::unique(corpus.vocabulary.begin(), corpus.vocabulary.end()),
                          corpus.vocabulary.end());
  std::unordered_map<char32_t, int64_t> id;
  for (size_t i = 0; i < corpus.vocabulary.size(); ++i) id[corpus.vocabulary[i]] = int64_t(i);
  at::Tensor tokens = at::empty({n}, at::kLong);
  int64_t* out = tokens.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) out[i] = id[text[static_cast<size_t>(i)]];
  corpus.train = Windows{tokens.narrow(0, 0, train_len), block_size};
  corpus.validation = Windows{tokens.narrow(0, train_len, n - train_len), block_size};
  return corpus;
}

}  // namespace gpt
