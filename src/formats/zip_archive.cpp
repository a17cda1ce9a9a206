#include "formats/zip_archive.h"
#include "distributed/common/check.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <set>

namespace ddp {
namespace detail {

// Note [Integrity check]
// torch.save and torch::pickle_save write a zip archive whose records (the pickle and
// one per tensor storage) are stored uncompressed, each with a CRC-32 in the central
// directory. LibTorch's reader does not verify those CRCs, and it accepts a file with a
// cut-off end record, so a flipped bit in a tensor would load as a silently different
// weight. Before unpickling, this walks the archive itself: the end record must sit
// exactly at the end of the file, every record must lie inside it, and every stored
// record's bytes must match its CRC-32. The archive stays exactly what torch.load reads.

namespace {

constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50;
constexpr uint32_t kEnd64LocatorSig = 0x07064b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kLocalSig = 0x04034b50;

// CRC-32 (IEEE 802.3, as zip), eight bytes per step.
struct Crc32Table {
  std::array<std::array<uint32_t, 256>, 8> table{};
  Crc32Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (size_t t = 1; t < 8; ++t) {
        table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
      }
    }
  }
  uint32_t operator()(const unsigned char* p, size_t n) const {
    uint32_t c = 0xffffffffu;
    while (n >= 8) {
      const uint32_t lo = c ^ (p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24);
      c = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
          table[4][lo >> 24] ^ table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^ table[0][p[7]];
      p += 8;
      n -= 8;
    }
    while (n-- > 0) c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
  }
};

const Crc32Table& crc32() {
  static const Crc32Table table;
  return table;
}

class Reader {
 public:
  Reader(std::string_view bytes, const std::string& where) : bytes_(bytes), where_(where) {}

  uint64_t le(uint64_t offset, int width) const {
    need(offset, static_cast<uint64_t>(width), "a header");
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i) {
      v = v << 8 | static_cast<unsigned char>(bytes_[offset + static_cast<uint64_t>(i)]);
    }
    return v;
  }
  void need(uint64_t offset, uint64_t size, const std::string& what) const {
    if (offset > bytes_.size() || size > bytes_.size() - offset) {
      fail(what + " reaches past the end of the file (offset " + std::to_string(offset) + ", " +
           std::to_string(size) + " bytes)");
    }
  }
  [[noreturn]] void fail(const std::string& why) const {
    C10_THROW_ERROR(Error, c10::str(where_, ": the file is truncated or corrupt (", bytes_.size(),
                                    " bytes; ", why,
                                    "). Expected a complete file written by "
                                    "ddp::save_checkpoint or torch.save; load an older "
                                    "checkpoint instead."));
  }
  uint64_t size() const { return bytes_.size(); }
  const unsigned char* data(uint64_t offset) const {
    return reinterpret_cast<const unsigned char*>(bytes_.data()) + offset;
  }
  std::string text(uint64_t offset, uint64_t n) const {
    need(offset, n, "a record name");
    return std::string(bytes_.substr(offset, n));
  }

 private:
  std::string_view bytes_;
  const std::string& where_;
};

}  // namespace

std::vector<ZipRecord> read_zip(std::string_view bytes, const std::string& where) {
  const Reader r(bytes, where);
  if (r.size() < 22) r.fail("too short for a zip archive");
  // The end record, with its comment, must end exactly at the end of the file.
  uint64_t end = r.size() - 22;
  const uint64_t lowest = r.size() >= 22 + 0xffff ? r.size() - 22 - 0xffff : 0;
  while (true) {
    if (r.le(end, 4) == kEndSig && end + 22 + r.le(end + 20, 2) == r.size()) break;
    if (end == lowest) r.fail("no zip end record at the end of the file");
    --end;
  }
  uint64_t entries = r.le(end + 10, 2);
  uint64_t central = r.le(end + 16, 4);
  if (end >= 20 && r.le(end - 20, 4) == kEnd64LocatorSig) {
    const uint64_t end64 = r.le(end - 20 + 8, 8);
    if (r.le(end64, 4) != kEnd64Sig) r.fail("the zip64 end record is damaged");
    entries = r.le(end64 + 32, 8);
    central = r.le(end64 + 48, 8);
  }
  std::vector<ZipRecord> records;
  // Two records of one name would leave it to each reader which one it takes (ours checks
  // both; LibTorch's takes the first): refused, as damaged or crafted.
  std::set<std::string> names;
  uint64_t at = central;
  for (uint64_t i = 0; i < entries; ++i) {
    if (r.le(at, 4) != kCentralSig)
      r.fail("central directory entry " + std::to_string(i) + " is damaged");
    const uint64_t method = r.le(at + 10, 2);
    const uint64_t crc = r.le(at + 16, 4);
    uint64_t compressed = r.le(at + 20, 4);
    uint64_t uncompressed = r.le(at + 24, 4);
    const uint64_t name_len = r.le(at + 28, 2);
    const uint64_t extra_len = r.le(at + 30, 2);
    const uint64_t comment_len = r.le(at + 32, 2);
    uint64_t local = r.le(at + 42, 4);
    const std::string name = r.text(at + 46, name_len);
    // Zip64: the 0xffffffff fields are in extra field 0x0001, in this order.
    for (uint64_t e = at + 46 + name_len; e + 4 <= at + 46 + name_len + extra_len;) {
      const uint64_t id = r.le(e, 2);
      const uint64_t len = r.le(e + 2, 2);
      if (id == 0x0001) {
        uint64_t f = e + 4;
        if (uncompressed == 0xffffffff) {
          uncompressed = r.le(f, 8);
          f += 8;
        }
        if (compressed == 0xffffffff) {
          compressed = r.le(f, 8);
          f += 8;
        }
        if (local == 0xffffffff) {
          local = r.le(f, 8);
        }
      }
      e += 4 + len;
    }
    if (r.le(local, 4) != kLocalSig) r.fail("the header of record '" + name + "' is damaged");
    const uint64_t data = local + 30 + r.le(local + 26, 2) + r.le(local + 28, 2);
    r.need(data, compressed, "record '" + name + "'");
    if (method == 0) {
      if (compressed != uncompressed) r.fail("record '" + name + "' has inconsistent sizes");
      const uint32_t actual = crc32()(r.data(data), compressed);
      if (actual != crc) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "recorded 0x%08x, computed 0x%08x",
                      static_cast<unsigned>(crc), static_cast<unsigned>(actual));
        r.fail("record '" + name + "' fails its CRC-32 check, " + buf);
      }
    }
    if (!names.insert(name).second) r.fail("two records are named '" + name + "'");
    records.push_back({name, data, compressed});
    at += 46 + name_len + extra_len + comment_len;
  }
  return records;
}

namespace {

void put(std::string& out, uint64_t value, int width) {
  for (int i = 0; i < width; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

std::string write_zip(const std::vector<std::pair<std::string, std::string_view>>& records) {
  std::string out;
  std::string central;
  for (const auto& record : records) {
    const std::string& name = record.first;
    const std::string_view data = record.second;
    DDP_CHECK(data.size() < 0xffffffffu && out.size() < 0xffffffffu, "record '", name, "' of ",
              data.size(),
              " bytes is too large for rewriting a "
              "Python pickle (4 GiB at most); see Note [Python pickles]");
    const uint32_t crc = crc32()(reinterpret_cast<const unsigned char*>(data.data()), data.size());
    const uint64_t local = out.size();
    put(out, kLocalSig, 4);
    put(out, 20, 2);  // version needed
    put(out, 0, 2);   // flags
    put(out, 0, 2);   // method: stored
    put(out, 0, 4);   // time, date
    put(out, crc, 4);
    put(out, data.size(), 4);
    put(out, data.size(), 4);
    put(out, name.size(), 2);
    put(out, 0, 2);  // extra
    out += name;
    out.append(data.data(), data.size());

    put(central, kCentralSig, 4);
    put(central, 20, 2);  // version made by
    put(central, 20, 2);  // version needed
    put(central, 0, 2);
    put(central, 0, 2);
    put(central, 0, 4);
    put(central, crc, 4);
    put(central, data.size(), 4);
    put(central, data.size(), 4);
    put(central, name.size(), 2);
    put(central, 0, 2);  // extra
    put(central, 0, 2);  // comment
    put(central, 0, 2);  // disk
    put(central, 0, 2);  // internal attributes
    put(central, 0, 4);  // external attributes
    put(central, local, 4);
    central += name;
  }
  const uint64_t central_offset = out.size();
  out += central;
  put(out, kEndSig, 4);
  put(out, 0, 4);  // disk numbers
  put(out, records.size(), 2);
  put(out, records.size(), 2);
  put(out, central.size(), 4);
  put(out, central_offset, 4);
  put(out, 0, 2);  // comment
  return out;
}

}  // namespace detail
}  // namespace ddp
