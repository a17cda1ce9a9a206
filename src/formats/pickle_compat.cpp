#include "formats/pickle_compat.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

namespace ddp {
namespace detail {

// Note [Python pickles]
// Python's model.state_dict() is a collections.OrderedDict with a `_metadata` attribute,
// and small dicts are pickled with SETITEM. LibTorch's unpickler (1.13, and 2.x before
// it learnt OrderedDict) turns an OrderedDict into None, and knows neither SETITEM,
// APPEND nor a BUILD on a dict, so torch::pickle_load cannot read a plain
// torch.save(model.state_dict()). This rewrites the pickle program (protocol 2, what
// torch.save writes) into one it reads, with the same values:
//   GLOBAL collections.OrderedDict  -> GLOBAL torch.jit._pickle.restore_type_tag, and its
//   () argument                     -> ({}, "Dict[str, Any]"): an empty dict
//   k v SETITEM                     -> MARK k v SETITEMS        (likewise APPEND)
//   dict state BUILD                -> dict MARK kBuildStateKey state SETITEMS
// The last keeps the attribute state as a dict entry, which drop_build_states removes.
// Rewriting only inserts bytes before an object or swaps one opcode, so memo indices
// (BINPUT/BINGET) keep their meaning.

namespace {

enum class ItemKind { Other, Mark, EmptyTuple, OrderedDictClass, Dict };

struct Item {
  size_t start;  // where the opcodes that built this stack item begin
  ItemKind kind;
};

struct Edit {
  size_t offset;
  size_t remove;
  std::string insert;
};

std::string binunicode(const std::string& s) {
  std::string out = "X";
  const uint32_t n = static_cast<uint32_t>(s.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + s;
}

class Rewriter {
 public:
  explicit Rewriter(std::string_view p) : p_(p) {}

  // False when the program holds something this does not understand.
  bool run() {
    while (pos_ < p_.size()) {
      const size_t at = pos_;
      const unsigned char op = static_cast<unsigned char>(p_[pos_++]);
      if (!step(op, at)) return false;
      if (op == '.') return true;
    }
    return false;
  }

  std::optional<std::string> result() const {
    if (edits_.empty()) return std::nullopt;
    std::vector<Edit> edits = edits_;
    std::stable_sort(edits.begin(), edits.end(),
                     [](const Edit& a, const Edit& b) { return a.offset < b.offset; });
    std::string out;
    size_t copied = 0;
    for (const Edit& e : edits) {
      out.append(p_.substr(copied, e.offset - copied));
      out += e.insert;
      copied = e.offset + e.remove;
    }
    out.append(p_.substr(copied));
    return out;
  }

 private:
  bool skip(size_t n) {
    if (pos_ + n > p_.size()) return false;
    pos_ += n;
    return true;
  }
  bool read_uint(size_t n, uint64_t* v) {
    if (pos_ + n > p_.size()) return false;
    *v = 0;
    for (size_t i = 0; i < n; ++i) {
      *v |= static_cast<uint64_t>(static_cast<unsigned char>(p_[pos_ + i])) << (8 * i);
    }
    pos_ += n;
    return true;
  }
  bool skip_line(std::string* line = nullptr) {
    const size_t nl = p_.find('\n', pos_);
    if (nl == std::string_view::npos) return false;
    if (line) *line = std::string(p_.substr(pos_, nl - pos_));
    pos_ = nl + 1;
    return true;
  }
  bool push(size_t start, ItemKind kind = ItemKind::Other) {
    stack_.push_back({start, kind});
    return true;
  }
  bool pop(size_t n, Item* deepest = nullptr) {
    if (stack_.size() < n) return false;
    if (deepest && n > 0) *deepest = stack_[stack_.size() - n];
    stack_.resize(stack_.size() - n);
    return true;
  }
  // Pops down to and including the topmost MARK; returns the MARK's item.
  bool pop_mark(Item* mark) {
    for (size_t i = stack_.size(); i-- > 0;) {
      if (stack_[i].kind == ItemKind::Mark) {
        *mark = stack_[i];
        stack_.resize(i);
        return true;
      }
    }
    return false;
  }
  ItemKind memo_kind(uint64_t index) const {
    const auto it = memo_.find(index);
    return it == memo_.end() ? ItemKind::Other : it->second;
  }
  bool memoize(uint64_t index) {
    if (stack_.empty()) return false;
    memo_[index] = stack_.back().kind == ItemKind::OrderedDictClass ? ItemKind::OrderedDictClass
                                                                    : ItemKind::Other;
    return true;
  }

  bool step(unsigned char op, size_t at) {
    uint64_t n = 0;
    Item item{};
    switch (op) {
      case 0x80:
        return skip(1);  // PROTO
      case '.':
        return true;  // STOP
      case '(':
        return push(at, ItemKind::Mark);  // MARK
      case '0':
        return pop(1);  // POP
      case '1':
        return pop_mark(&item);  // POP_MARK
      case '2':
        return !stack_.empty() && push(at);  // DUP
      case 'N':
      case 0x88:
      case 0x89:
        return push(at);  // NONE, NEWTRUE, NEWFALSE
      case 'I':
      case 'L':
      case 'F':
      case 'S':
      case 'V':  // text arguments
        return skip_line() && push(at);
      case 'J':
        return skip(4) && push(at);  // BININT
      case 'K':
        return skip(1) && push(at);  // BININT1
      case 'M':
        return skip(2) && push(at);  // BININT2
      case 'G':
        return skip(8) && push(at);  // BINFLOAT
      case 0x8a:
      case 'U':
      case 'C':  // LONG1, SHORT_BIN{STRING,BYTES}
        return read_uint(1, &n) && skip(n) && push(at);
      case 0x8b:
      case 'T':
      case 'X':
      case 'B':  // LONG4, BINSTRING, BINUNICODE, BINBYTES
        return read_uint(4, &n) && skip(n) && push(at);
      case ')':
        return push(at, ItemKind::EmptyTuple);  // EMPTY_TUPLE
      case ']':
        return push(at);  // EMPTY_LIST
      case '}':
        return push(at, ItemKind::Dict);  // EMPTY_DICT
      case 't':
      case 'l':  // TUPLE, LIST
        return pop_mark(&item) && push(item.start);
      case 'd':
        return pop_mark(&item) && push(item.start, ItemKind::Dict);  // DICT
      case 0x85:
        return pop(1, &item) && push(item.start);  // TUPLE1
      case 0x86:
        return pop(2, &item) && push(item.start);  // TUPLE2
      case 0x87:
        return pop(3, &item) && push(item.start);  // TUPLE3
      case 'e':
      case 'u':
        return pop_mark(&item);  // APPENDS, SETITEMS
      case 'a':                  // APPEND -> MARK v APPENDS
        if (!pop(1, &item)) return false;
        edits_.push_back({item.start, 0, "("});
        edits_.push_back({at, 1, "e"});
        return true;
      case 's':  // SETITEM -> MARK k v SETITEMS
        if (!pop(2, &item)) return false;
        edits_.push_back({item.start, 0, "("});
        edits_.push_back({at, 1, "u"});
        return true;
      case 'h':
        return read_uint(1, &n) && push(at, memo_kind(n));  // BINGET
      case 'j':
        return read_uint(4, &n) && push(at, memo_kind(n));  // LONG_BINGET
      case 'q':
        return read_uint(1, &n) && memoize(n);  // BINPUT
      case 'r':
        return read_uint(4, &n) && memoize(n);  // LONG_BINPUT
      case 'c': {                               // GLOBAL
        const size_t text = pos_;
        std::string module, name;
        if (!skip_line(&module) || !skip_line(&name)) return false;
        if (module == "collections" && name == "OrderedDict") {
          edits_.push_back({text, pos_ - text, "torch.jit._pickle\nrestore_type_tag\n"});
          return push(at, ItemKind::OrderedDictClass);
        }
        return push(at);
      }
      case 'R': {  // REDUCE
        if (stack_.size() < 2) return false;
        const Item callable = stack_[stack_.size() - 2];
        const Item args = stack_.back();
        if (callable.kind == ItemKind::OrderedDictClass) {
          if (args.kind != ItemKind::EmptyTuple) return false;
          edits_.push_back({args.start, 1, "}" + binunicode("Dict[str, Any]") + "\x86"});
          return pop(2) && push(callable.start, ItemKind::Dict);
        }
        return pop(2) && push(callable.start);
      }
      case 0x81:
        return pop(2, &item) && push(item.start);  // NEWOBJ
      case 'b': {                                  // BUILD
        if (stack_.size() < 2 || stack_[stack_.size() - 2].kind != ItemKind::Dict) return false;
        const Item state = stack_.back();
        edits_.push_back({state.start, 0, "(" + binunicode(kBuildStateKey)});
        edits_.push_back({at, 1, "u"});
        return pop(1);
      }
      case 'Q':
        return pop(1, &item) && push(item.start);  // BINPERSID
      default:
        return false;
    }
  }

  std::string_view p_;
  size_t pos_ = 0;
  std::vector<Item> stack_;
  std::map<uint64_t, ItemKind> memo_;
  std::vector<Edit> edits_;
};

}  // namespace

std::optional<std::string> rewrite_python_pickle(std::string_view pickle) {
  Rewriter rewriter(pickle);
  if (!rewriter.run()) return std::nullopt;
  return rewriter.result();
}

void drop_build_states(const c10::IValue& value) {
  if (value.isGenericDict()) {
    c10::impl::GenericDict dict = value.toGenericDict();
    (void)dict.erase(c10::IValue(std::string(kBuildStateKey)));
    for (const auto& entry : dict) drop_build_states(entry.value());
  } else if (value.isList()) {
    for (const c10::IValue& v : value.toListRef()) drop_build_states(v);
  } else if (value.isTuple()) {
    for (const c10::IValue& v : value.toTupleRef().elements()) drop_build_states(v);
  }
}

}  // namespace detail
}  // namespace ddp
