#include "formats/py_pickle.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

// Note [Safe pickle reading]
// A pickle is a program for a stack machine, and Python's own unpickler runs it: GLOBAL imports
// any module.name, REDUCE calls it, BUILD calls __setstate__. Bytes from disk may be hostile,
// so read() only ever records what the program would build, as a tree of Values, and runs
// nothing. Its rules:
//  - A class or function is a name (kGlobal), and only one that the caller's allowlist accepts.
//    REDUCE and NEWOBJ take only such a name as their callable, never a value computed by the
//    pickle (a call's result called again is how pickled exploits chain one call to another).
//  - Opcodes that reach outside the bytes or run code by other routes are refused: PERSID and
//    BINPERSID (persistent ids), INST and OBJ (protocol 0/1 calls), EXT1/2/4 (the copyreg
//    extension registry), NEWOBJ_EX (keyword arguments; Python's pickler only emits it for
//    classes that need them), NEXT_BUFFER and READONLY_BUFFER (out-of-band buffers).
//  - Every length is checked against the bytes that remain before anything is allocated, so a
//    length of 2^64 costs nothing; a memo index is a key in a map, never a size to allocate.
//  - Nesting is bounded where it is made (ReadLimits::max_depth, for values and for MARKs),
//    so that nothing that walks a result (the writer, describe(), destructors) recurses deeply,
//    and so is the number of values made (max_items).
//  - No value can ever contain itself: a list, dict or object may only be changed (APPEND,
//    SETITEMS, BUILD, ...) while no other value holds it. Python's pickler always finishes a
//    value before placing it in another one, so only a pickle of a cyclic structure (or a
//    hostile one) breaks this rule, and refusing it keeps every result a finite DAG whose
//    depth was checked when each node was made (a change after the check could deepen it).
// Values shared through the memo (PUT/GET) are the same node, as in Python; a change made
// through one reference is seen through all of them.

namespace ddp {
namespace detail {
namespace py {

// Note [Iterative teardown]
// A tree built by hand may nest deeper than the stack allows to recurse. A node that holds the
// last reference to a child moves the child's own children into a list of pending nodes before
// the child dies, so each destructor frees one level and none recurses.
Value::~Value() {
  if (items.empty() && dict.empty() && !callable && !state) return;
  std::vector<ValuePtr> pending;
  auto take = [&pending](Value& v) {
    for (auto& item : v.items) pending.push_back(std::move(item));
    for (auto& kv : v.dict) {
      pending.push_back(std::move(kv.first));
      pending.push_back(std::move(kv.second));
    }
    if (v.callable) pending.push_back(std::move(v.callable));
    if (v.state) pending.push_back(std::move(v.state));
    v.items.clear();
    v.dict.clear();
  };
  take(*this);
  while (!pending.empty()) {
    ValuePtr next = std::move(pending.back());
    pending.pop_back();
    // Every Value is made non-const (make_shared<Value> or the reader's nodes), so changing
    // one that nobody else can see is defined.
    if (next && next.use_count() == 1) take(const_cast<Value&>(*next));
  }
}

namespace {

std::shared_ptr<Value> make(Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

// `s` for an error message: printable ASCII as is, other bytes escaped, long strings cut.
std::string quote(std::string_view s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (size_t k = 0; k < s.size() && k < 80; ++k) {
    unsigned char c = static_cast<unsigned char>(s[k]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > 80) out += "...";
  return out;
}

// UTF-8 as Python's "surrogatepass" codec takes it: encoded surrogates are allowed (Python's
// pickler writes them so), overlong forms and code points past U+10FFFF are not.
bool valid_utf8(std::string_view s) {
  size_t k = 0;
  while (k < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[k]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++k;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      n = 1, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - k - 1 < n) return false;
    for (size_t j = 1; j <= n; ++j) {
      unsigned char t = static_cast<unsigned char>(s[k + j]);
      if ((t & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (t & 0x3f);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff))) return false;
    k += n + 1;
  }
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

std::string latin1_to_utf8(std::string_view s) {
  std::string out;
  for (char c : s) append_utf8(out, static_cast<unsigned char>(c));
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Each entry is the opcode's byte, then its name.
const char* opcode_name(uint8_t op) {
  // clang-format off
  static const char* const names[] = {
      "(MARK", ".STOP", "0POP", "1POP_MARK", "2DUP", "FFLOAT", "IINT", "JBININT", "KBININT1",
      "LLONG", "MBININT2", "NNONE", "PPERSID", "QBINPERSID", "RREDUCE", "SSTRING", "TBINSTRING",
      "USHORT_BINSTRING", "VUNICODE", "XBINUNICODE", "aAPPEND", "bBUILD", "cGLOBAL", "dDICT",
      "}EMPTY_DICT", "eAPPENDS", "gGET", "hBINGET", "iINST", "jLONG_BINGET", "lLIST", "]EMPTY_LIST", "oOBJ",
      "pPUT", "qBINPUT", "rLONG_BINPUT", "sSETITEM", "tTUPLE", ")EMPTY_TUPLE", "uSETITEMS",
      "GBINFLOAT", "BBINBYTES", "CSHORT_BINBYTES", "\x80" "PROTO", "\x81" "NEWOBJ",
      "\x82" "EXT1", "\x83" "EXT2", "\x84" "EXT4", "\x85" "TUPLE1", "\x86" "TUPLE2",
      "\x87" "TUPLE3", "\x88" "NEWTRUE", "\x89" "NEWFALSE", "\x8a" "LONG1", "\x8b" "LONG4",
      "\x8c" "SHORT_BINUNICODE", "\x8d" "BINUNICODE8", "\x8e" "BINBYTES8", "\x8f" "EMPTY_SET",
      "\x90" "ADDITEMS", "\x91" "FROZENSET", "\x92" "NEWOBJ_EX", "\x93" "STACK_GLOBAL",
      "\x94" "MEMOIZE", "\x95" "FRAME", "\x96" "BYTEARRAY8", "\x97" "NEXT_BUFFER",
      "\x98" "READONLY_BUFFER"};
  // clang-format on
  for (const char* entry : names) {
    if (static_cast<uint8_t>(entry[0]) == op) return entry + 1;
  }
  return nullptr;
}

}  // namespace

ValuePtr none() { return make(Kind::kNone); }
ValuePtr boolean(bool value) {
  auto v = make(Kind::kBool);
  v->b = value;
  return v;
}
ValuePtr integer(int64_t value) {
  auto v = make(Kind::kInt);
  v->i = value;
  return v;
}
ValuePtr real(double value) {
  auto v = make(Kind::kFloat);
  v->f = value;
  return v;
}
ValuePtr str(std::string utf8) {
  auto v = make(Kind::kStr);
  v->s = std::move(utf8);
  return v;
}
ValuePtr bytes(std::string raw) {
  auto v = make(Kind::kBytes);
  v->s = std::move(raw);
  return v;
}
ValuePtr tuple(std::vector<ValuePtr> items) {
  auto v = make(Kind::kTuple);
  v->items = std::move(items);
  return v;
}
ValuePtr list(std::vector<ValuePtr> items) {
  auto v = make(Kind::kList);
  v->items = std::move(items);
  return v;
}
ValuePtr dict(std::vector<std::pair<ValuePtr, ValuePtr>> items) {
  auto v = make(Kind::kDict);
  v->dict = std::move(items);
  return v;
}
ValuePtr global(std::string module, std::string name) {
  auto v = make(Kind::kGlobal);
  v->module = std::move(module);
  v->name = std::move(name);
  return v;
}
ValuePtr object(ValuePtr cls, std::vector<ValuePtr> args, ValuePtr state) {
  auto v = make(Kind::kObject);
  v->callable = std::move(cls);
  v->items = std::move(args);
  v->state = std::move(state);
  return v;
}
ValuePtr call(ValuePtr callable, std::vector<ValuePtr> args, ValuePtr state) {
  auto v = make(Kind::kCall);
  v->callable = std::move(callable);
  v->items = std::move(args);
  v->state = std::move(state);
  return v;
}

ValuePtr find(const Value& d, const std::string& key) {
  if (d.kind != Kind::kDict) return nullptr;
  for (auto it = d.dict.rbegin(); it != d.dict.rend(); ++it) {
    if (it->first && it->first->kind == Kind::kStr && it->first->s == key) return it->second;
  }
  return nullptr;
}

std::string describe(const Value& v) {
  auto named = [&v](const char* what) {
    const Value* c = v.callable.get();
    if (!c || c->kind != Kind::kGlobal) return std::string(what);
    return std::string(what) + " " + c->module + "." + c->name;
  };
  switch (v.kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kStr:
      return "str";
    case Kind::kBytes:
      return "bytes";
    case Kind::kTuple:
      return "tuple";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kGlobal:
      return "global " + v.module + "." + v.name;
    case Kind::kObject:
      return named("object");
    case Kind::kCall:
      return named("call");
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// Reading

namespace {

// What the reader knows of a node beyond its Value (Note [Safe pickle reading]).
struct Node : Value {
  size_t depth = 0;        // 0 for scalars; 1 + the deepest child for containers
  bool contained = false;  // held by another node: no longer changed
  char origin = 'l';       // for a kList: 'l' list, 's' set, 'f' frozenset
};
using NodePtr = std::shared_ptr<Node>;

class Reader {
 public:
  Reader(std::string_view in, const Allowlist& allowed, const std::string& where,
         const ReadLimits& limits)
      : in_(in), allowed_(allowed), where_(where), limits_(limits) {}

  ValuePtr run() {
    for (;;) {
      op_pos_ = pos_;
      have_op_ = false;
      if (pos_ >= in_.size()) fail("the pickle ends before its STOP opcode (truncated?)");
      op_ = static_cast<uint8_t>(in_[pos_++]);
      have_op_ = true;
      if (op_ == '.') {
        NodePtr result = pop();
        if (pos_ != in_.size()) {
          fail(std::to_string(in_.size() - pos_) +
               " byte(s) follow the STOP opcode that ends the pickle; a whole file is one "
               "pickle, so the file is corrupt or not what it should be");
        }
        return result;
      }
      step();
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    std::string msg = where_ + ": " + what + " (at byte " + std::to_string(op_pos_);
    if (have_op_) {
      const char* name = opcode_name(op_);
      msg += name ? std::string(", opcode ") + name : ", opcode 0x" + hex(op_);
    }
    throw std::runtime_error(msg + ")");
  }
  static std::string hex(uint8_t b) {
    static const char* digits = "0123456789abcdef";
    return {digits[b >> 4], digits[b & 15]};
  }

  // Input --------------------------------------------------------------------------------------
  std::string_view take(uint64_t n, const char* what) {
    if (n > in_.size() - pos_) {
      fail("the pickle says " + std::to_string(n) + " byte(s) of " + what + " follow, but only " +
           std::to_string(in_.size() - pos_) + " remain (truncated or corrupt)");
    }
    std::string_view out = in_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return out;
  }
  uint64_t le(size_t n) {  // an unsigned little-endian integer of n bytes
    if (n > in_.size() - pos_) {
      fail("the opcode needs " + std::to_string(n) + " byte(s) after it, but only " +
           std::to_string(in_.size() - pos_) + " remain (truncated?)");
    }
    std::string_view b = take(n, "operand");
    uint64_t v = 0;
    for (size_t k = n; k-- > 0;) v = (v << 8) | static_cast<unsigned char>(b[k]);
    return v;
  }
  uint64_t length32() {  // the signed 4-byte lengths of BINSTRING and LONG4
    int32_t n = static_cast<int32_t>(static_cast<uint32_t>(le(4)));
    if (n < 0) fail("a negative length (" + std::to_string(n) + ")");
    return static_cast<uint64_t>(n);
  }
  std::string_view line() {
    size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos) fail("the pickle ends inside a line of text (truncated?)");
    std::string_view out = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }
  std::string utf8(std::string_view s) {
    if (!valid_utf8(s)) fail("a str that is not valid UTF-8: '" + quote(s) + "'");
    return std::string(s);
  }

  // Stack ----------------------------------------------------------------------------------
  size_t frame_base() const { return marks_.empty() ? 0 : marks_.back(); }
  NodePtr pop() {
    if (stack_.size() <= frame_base()) fail("the opcode needs a value but the stack is empty");
    NodePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  NodePtr& top() {
    if (stack_.size() <= frame_base()) fail("the opcode needs a value but the stack is empty");
    return stack_.back();
  }
  std::vector<NodePtr> pop_mark() {
    if (marks_.empty()) fail("the opcode closes a MARK, but no MARK is open");
    std::vector<NodePtr> items(std::make_move_iterator(stack_.begin() + marks_.back()),
                               std::make_move_iterator(stack_.end()));
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  void push(NodePtr v) { stack_.push_back(std::move(v)); }

  // Nodes --------------------------------------------------------------------------------------
  NodePtr node(Kind kind) {
    if (++made_ > limits_.max_items) {
      fail("the pickle makes more than " + std::to_string(limits_.max_items) +
           " values (ReadLimits::max_items)");
    }
    auto v = std::make_shared<Node>();
    v->kind = kind;
    if (kind == Kind::kTuple || kind == Kind::kList || kind == Kind::kDict ||
        kind == Kind::kObject || kind == Kind::kCall) {
      v->depth = 1;
      check_depth(*v);
    }
    return v;
  }
  void check_depth(const Node& v) const {
    if (v.depth > limits_.max_depth) {
      fail("values nest more than " + std::to_string(limits_.max_depth) +
           " levels deep (ReadLimits::max_depth)");
    }
  }
  // `child` becomes part of `parent`: it may no longer change, and `parent` is deeper.
  ValuePtr adopt(Node& parent, const NodePtr& child) {
    child->contained = true;
    parent.depth = std::max(parent.depth, child->depth + 1);
    check_depth(parent);
    return child;
  }
  // `target` is about to change by gaining `child` (Note [Safe pickle reading]).
  void check_change(const Node& target, const Node* child) const {
    if (child == &target) fail("the pickle puts a " + describe(target) + " inside itself");
    if (target.contained) {
      fail("the pickle changes a " + describe(target) +
           " after placing it inside another value, as only a pickle of a structure that "
           "contains itself does; such structures are refused");
    }
  }
  NodePtr make_list(std::vector<NodePtr> items, Kind kind, char origin = 'l') {
    NodePtr v = node(kind);
    v->origin = origin;
    for (auto& item : items) v->items.push_back(adopt(*v, item));
    return v;
  }
  void set_items(const NodePtr& target, std::vector<NodePtr>& items) {
    if (items.size() % 2 != 0) fail("an odd number of values between MARK and SETITEMS");
    if (target->kind != Kind::kDict && target->kind != Kind::kObject &&
        target->kind != Kind::kCall) {
      fail("SETITEM needs a dict (or an object made by NEWOBJ or REDUCE), but got a " +
           describe(*target));
    }
    for (size_t k = 0; k < items.size(); k += 2) {
      check_change(*target, items[k].get());
      check_change(*target, items[k + 1].get());
      target->dict.emplace_back(adopt(*target, items[k]), adopt(*target, items[k + 1]));
    }
  }
  void append(const NodePtr& target, std::vector<NodePtr>& items, char origin) {
    if (target->kind != Kind::kList || target->origin != origin) {
      fail(std::string(origin == 's' ? "ADDITEMS needs a set" : "APPEND needs a list") +
           ", but got a " + (target->origin == 'l' ? describe(*target) : "set"));
    }
    for (auto& item : items) {
      check_change(*target, item.get());
      target->items.push_back(adopt(*target, item));
    }
  }
  NodePtr global(std::string module, std::string name) {
    if (proto_ < 3) {
      // Python 3 reads Python 2's names for the same things (fix_imports in pickle.loads).
      if (module == "__builtin__" || module == "exceptions") module = "builtins";
      if (module == "copy_reg") module = "copyreg";
    }
    if (!allowed_ || !allowed_(module, name)) {
      fail("the pickle names global '" + quote(module) + "." + quote(name) +
           "', which is not among those this file may hold; it was not loaded (a pickle "
           "that names other classes or functions is refused, as it could run code)");
    }
    NodePtr v = node(Kind::kGlobal);
    v->module = std::move(module);
    v->name = std::move(name);
    return v;
  }
  // REDUCE and NEWOBJ: `callable` must be a named global and `args` a tuple.
  NodePtr apply(Kind kind) {
    NodePtr args = pop();
    NodePtr callable = pop();
    if (callable->kind != Kind::kGlobal) {
      fail("the callable must be a class or function named by GLOBAL or STACK_GLOBAL, but it "
           "is a " +
           describe(*callable));
    }
    if (args->kind != Kind::kTuple) fail("the arguments must be a tuple, not a " + describe(*args));
    NodePtr v = node(kind);
    v->callable = adopt(*v, callable);
    for (auto& item : args->items) {
      v->items.push_back(
          adopt(*v, std::static_pointer_cast<Node>(std::const_pointer_cast<Value>(item))));
    }
    return v;
  }
  NodePtr memo_get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) {
      fail("the pickle reads memo entry " + std::to_string(index) + ", which it never stored");
    }
    return it->second;
  }
  NodePtr integer_node(int64_t value) {
    NodePtr v = node(Kind::kInt);
    v->i = value;
    return v;
  }
  NodePtr text_node(Kind kind, std::string s) {
    NodePtr v = node(kind);
    v->s = std::move(s);
    return v;
  }
  // LONG1/LONG4: two's complement, little-endian, as Python's decode_long.
  int64_t decode_long(std::string_view b) {
    if (b.empty()) return 0;
    bool negative = static_cast<unsigned char>(b.back()) & 0x80;
    for (size_t k = 8; k < b.size(); ++k) {
      if (static_cast<unsigned char>(b[k]) != (negative ? 0xff : 0x00)) {
        fail("an integer of " + std::to_string(b.size()) +
             " bytes, past the 64 bits this reader "
             "takes");
      }
    }
    if (b.size() > 8 && ((static_cast<unsigned char>(b[7]) & 0x80) != 0) != negative) {
      fail("an integer past the 64 bits this reader takes");
    }
    uint64_t u = negative ? ~uint64_t{0} : 0;
    for (size_t k = std::min<size_t>(b.size(), 8); k-- > 0;) {
      u = (u << 8) | static_cast<unsigned char>(b[k]);
    }
    // Shifting in fewer than 8 bytes keeps the sign-extended high bytes of `u`.
    return static_cast<int64_t>(u);
  }
  // INT and LONG text: an optional sign and decimal digits (Python 2 wrote no other form).
  int64_t parse_int(std::string_view s) {
    if (!s.empty() && s.back() == 'L') s.remove_suffix(1);
    if (!s.empty() && s.front() == '+') s.remove_prefix(1);
    int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec == std::errc::result_out_of_range) {
      fail("an integer '" + quote(s) + "' that is empty or past 64 bits");
    }
    if (ec != std::errc() || end != s.data() + s.size()) {
      fail("'" + quote(s) + "' where a decimal integer was expected");
    }
    return v;
  }
  double parse_float(std::string_view s) {
    if (!s.empty() && s.front() == '+') s.remove_prefix(1);
    double v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
      fail("'" + quote(s) + "' where a float was expected");
    }
    return v;
  }
  // STRING: a quoted Python 2 str literal, unescaped as codecs.escape_decode does.
  std::string parse_string(std::string_view s) {
    if (s.size() < 2 || s.front() != s.back() || (s.front() != '\'' && s.front() != '"')) {
      fail("the STRING opcode's argument must be quoted, but is '" + quote(s) + "'");
    }
    s = s.substr(1, s.size() - 2);
    std::string out;
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k] != '\\' || k + 1 == s.size()) {
        if (s[k] == '\\') fail("a STRING that ends with a lone backslash");
        out += s[k];
        continue;
      }
      char c = s[++k];
      static const std::string_view simple = "\\'\"abfnrtv", mapped = "\\'\"\a\b\f\n\r\t\v";
      if (size_t at = simple.find(c); at != std::string_view::npos) {
        out += mapped[at];
      } else if (c == '\n') {
      } else if (c == 'x') {
        int hi = k + 1 < s.size() ? hex_digit(s[k + 1]) : -1;
        int lo = k + 2 < s.size() ? hex_digit(s[k + 2]) : -1;
        if (hi < 0 || lo < 0) fail("a STRING with a \\x escape not followed by two hex digits");
        out += static_cast<char>(hi * 16 + lo);
        k += 2;
      } else if (c >= '0' && c <= '7') {
        int v = c - '0';
        for (int n = 0; n < 2 && k + 1 < s.size() && s[k + 1] >= '0' && s[k + 1] <= '7'; ++n) {
          v = v * 8 + (s[++k] - '0');
        }
        out += static_cast<char>(v & 0xff);
      } else {
        out += '\\';
        out += c;
      }
    }
    return out;
  }
  // UNICODE: raw-unicode-escape, Latin-1 bytes but for \uXXXX and \UXXXXXXXX escapes (after
  // an odd number of backslashes, as Python decodes them).
  std::string parse_unicode(std::string_view s) {
    std::string out;
    for (size_t k = 0; k < s.size();) {
      if (s[k] != '\\') {
        append_utf8(out, static_cast<unsigned char>(s[k++]));
        continue;
      }
      size_t run = 0;
      while (k < s.size() && s[k] == '\\') ++run, ++k;
      size_t digits = k < s.size() ? (s[k] == 'u' ? 4 : s[k] == 'U' ? 8 : 0) : 0;
      if (run % 2 == 0 || digits == 0) {
        out.append(run, '\\');
        continue;
      }
      out.append(run - 1, '\\');
      if (s.size() - k - 1 < digits) fail("a UNICODE escape cut short");
      uint32_t cp = 0;
      for (size_t n = 1; n <= digits; ++n) {
        int d = hex_digit(s[k + n]);
        if (d < 0) fail("a UNICODE escape with a character that is not a hex digit");
        cp = cp * 16 + static_cast<uint32_t>(d);
      }
      if (cp > 0x10ffff) fail("a UNICODE escape past U+10FFFF");
      append_utf8(out, cp);
      k += digits + 1;
    }
    return out;
  }

  void step();

  std::string_view in_;
  const Allowlist& allowed_;
  const std::string& where_;
  const ReadLimits& limits_;
  size_t pos_ = 0, op_pos_ = 0, made_ = 0;
  uint8_t op_ = 0;
  bool have_op_ = false;
  int proto_ = 0;
  std::vector<NodePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, NodePtr> memo_;
};

void Reader::step() {
  switch (op_) {
    case 0x80:  // PROTO
      proto_ = static_cast<int>(le(1));
      if (proto_ > 5) fail("protocol " + std::to_string(proto_) + "; this reader takes 0 to 5");
      return;
    case 0x95: {  // FRAME: only a hint for buffering, but its length must still fit
      uint64_t n = le(8);
      if (n > in_.size() - pos_) {
        fail("a frame of " + std::to_string(n) + " byte(s), but only " +
             std::to_string(in_.size() - pos_) + " remain (truncated or corrupt)");
      }
      return;
    }
    case '(':
      if (marks_.size() >= limits_.max_depth) {
        fail("MARKs nest more than " + std::to_string(limits_.max_depth) +
             " levels deep (ReadLimits::max_depth)");
      }
      marks_.push_back(stack_.size());
      return;
    case '0':  // POP; in an empty frame, Python drops the MARK
      if (stack_.size() > frame_base() || marks_.empty()) {
        pop();
      } else {
        pop_mark();
      }
      return;
    case '1':
      pop_mark();
      return;
    case '2': {
      NodePtr v = top();
      push(std::move(v));
      return;
    }
    case 'N':
      push(node(Kind::kNone));
      return;
    case 0x88:
    case 0x89: {
      NodePtr v = node(Kind::kBool);
      v->b = op_ == 0x88;
      push(std::move(v));
      return;
    }
    case 'I': {
      std::string_view s = line();
      if (s == "00" || s == "01") {
        NodePtr v = node(Kind::kBool);
        v->b = s == "01";
        push(std::move(v));
      } else {
        push(integer_node(parse_int(s)));
      }
      return;
    }
    case 'L':
      push(integer_node(parse_int(line())));
      return;
    case 'J':
      push(integer_node(static_cast<int32_t>(static_cast<uint32_t>(le(4)))));
      return;
    case 'K':
      push(integer_node(static_cast<int64_t>(le(1))));
      return;
    case 'M':
      push(integer_node(static_cast<int64_t>(le(2))));
      return;
    case 0x8a:
      push(integer_node(decode_long(take(le(1), "integer"))));
      return;
    case 0x8b:
      push(integer_node(decode_long(take(length32(), "integer"))));
      return;
    case 'G': {
      std::string_view b = take(8, "float");
      uint64_t u = 0;
      for (char c : b) u = (u << 8) | static_cast<unsigned char>(c);  // big-endian
      NodePtr v = node(Kind::kFloat);
      std::memcpy(&v->f, &u, sizeof u);
      push(std::move(v));
      return;
    }
    case 'F': {
      NodePtr v = node(Kind::kFloat);
      v->f = parse_float(line());
      push(std::move(v));
      return;
    }
    // Python 2 str: read as Latin-1 text (pickle.loads(..., encoding="latin1")).
    case 'S':
      push(text_node(Kind::kStr, latin1_to_utf8(parse_string(line()))));
      return;
    case 'T':
      push(text_node(Kind::kStr, latin1_to_utf8(take(length32(), "string"))));
      return;
    case 'U':
      push(text_node(Kind::kStr, latin1_to_utf8(take(le(1), "string"))));
      return;
    case 'V':
      push(text_node(Kind::kStr, parse_unicode(line())));
      return;
    case 'X':
      push(text_node(Kind::kStr, utf8(take(le(4), "str"))));
      return;
    case 0x8c:
      push(text_node(Kind::kStr, utf8(take(le(1), "str"))));
      return;
    case 0x8d:
      push(text_node(Kind::kStr, utf8(take(le(8), "str"))));
      return;
    case 'B':
      push(text_node(Kind::kBytes, std::string(take(le(4), "bytes"))));
      return;
    case 'C':
      push(text_node(Kind::kBytes, std::string(take(le(1), "bytes"))));
      return;
    case 0x8e:
    case 0x96:
      push(text_node(Kind::kBytes, std::string(take(le(8), "bytes"))));
      return;
    case ')':
      push(node(Kind::kTuple));
      return;
    case 0x85:
    case 0x86:
    case 0x87: {
      size_t n = op_ - 0x84u;
      std::vector<NodePtr> items(n);
      for (size_t k = n; k-- > 0;) items[k] = pop();
      push(make_list(std::move(items), Kind::kTuple));
      return;
    }
    case 't':
      push(make_list(pop_mark(), Kind::kTuple));
      return;
    case ']':
      push(node(Kind::kList));
      return;
    case 'l':
      push(make_list(pop_mark(), Kind::kList));
      return;
    case 0x8f:
      push(make_list({}, Kind::kList, 's'));
      return;
    case 0x91:
      push(make_list(pop_mark(), Kind::kList, 'f'));
      return;
    case 'a': {
      std::vector<NodePtr> items{pop()};
      append(top(), items, 'l');
      return;
    }
    case 'e':
    case 0x90: {
      std::vector<NodePtr> items = pop_mark();
      append(top(), items, op_ == 'e' ? 'l' : 's');
      return;
    }
    case '}':
      push(node(Kind::kDict));
      return;
    case 'd': {
      std::vector<NodePtr> items = pop_mark();
      NodePtr d = node(Kind::kDict);
      set_items(d, items);
      push(std::move(d));
      return;
    }
    case 's': {
      std::vector<NodePtr> items(2);
      items[1] = pop();
      items[0] = pop();
      set_items(top(), items);
      return;
    }
    case 'u': {
      std::vector<NodePtr> items = pop_mark();
      set_items(top(), items);
      return;
    }
    case 'c': {
      std::string module = utf8(line());
      std::string name = utf8(line());
      push(global(std::move(module), std::move(name)));
      return;
    }
    case 0x93: {
      NodePtr name = pop();
      NodePtr module = pop();
      if (module->kind != Kind::kStr || name->kind != Kind::kStr) {
        fail("STACK_GLOBAL needs two str values, but got a " + describe(*module) + " and a " +
             describe(*name));
      }
      push(global(module->s, name->s));
      return;
    }
    case 'R':
      push(apply(Kind::kCall));
      return;
    case 0x81:
      push(apply(Kind::kObject));
      return;
    case 'b': {
      NodePtr state = pop();
      NodePtr& target = top();
      if (target->kind != Kind::kObject && target->kind != Kind::kCall) {
        fail("BUILD needs an object made by NEWOBJ or REDUCE, but got a " + describe(*target));
      }
      if (target->state) fail("a second BUILD of the same " + describe(*target));
      check_change(*target, state.get());
      target->state = adopt(*target, state);
      return;
    }
    case 'p':
      memo_[static_cast<uint64_t>(parse_int(line()))] = top();
      return;
    case 'q':
      memo_[le(1)] = top();
      return;
    case 'r':
      memo_[le(4)] = top();
      return;
    case 0x94:
      memo_[memo_.size()] = top();
      return;
    case 'g':
      push(memo_get(static_cast<uint64_t>(parse_int(line()))));
      return;
    case 'h':
      push(memo_get(le(1)));
      return;
    case 'j':
      push(memo_get(le(4)));
      return;
    case 'P':
    case 'Q':
      fail("a persistent id, which refers to something outside the pickle; this reader takes "
           "only self-contained pickles");
    case 'i':
    case 'o':
    case 0x92:
      fail("an opcode that calls a class with arguments this reader does not take (only "
           "REDUCE and NEWOBJ of allowlisted globals are read)");
    case 0x82:
    case 0x83:
    case 0x84:
      fail("an extension code (copyreg's registry), which this reader does not resolve");
    case 0x97:
    case 0x98:
      fail("an out-of-band buffer, which this reader does not take");
    default:
      fail("an unknown opcode; the bytes are not a pickle of protocol 0 to 5, or are corrupt");
  }
}

}  // namespace

ValuePtr read(std::string_view bytes, const Allowlist& allowed, const std::string& where,
              const ReadLimits& limits) {
  return Reader(bytes, allowed, where, limits).run();
}

// ---------------------------------------------------------------------------------------------
// Writing

namespace {

constexpr size_t kMaxWriteDepth = 1000;

class Writer {
 public:
  std::string run(const ValuePtr& value) {
    out_ = "\x80\x04";  // PROTO 4
    write(value, 0);
    out_ += '.';
    return out_;
  }

 private:
  [[noreturn]] static void fail(const std::string& what) {
    throw std::runtime_error("py::write: " + what);
  }
  void byte(unsigned v) { out_ += static_cast<char>(v); }
  void le(uint64_t v, size_t n) {
    for (size_t k = 0; k < n; ++k) byte((v >> (8 * k)) & 0xff);
  }
  void sized(std::string_view s, unsigned op1, unsigned op4, unsigned op8) {
    if (s.size() < 256) {
      byte(op1), le(s.size(), 1);
    } else if (s.size() <= 0xffffffffu) {
      byte(op4), le(s.size(), 4);
    } else {
      byte(op8), le(s.size(), 8);
    }
    out_ += s;
  }
  void integer(int64_t v) {
    if (v >= 0 && v <= 0xff) {
      byte('K'), le(static_cast<uint64_t>(v), 1);
    } else if (v >= 0 && v <= 0xffff) {
      byte('M'), le(static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      byte('J'), le(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {
      // LONG1: the fewest two's complement bytes that keep the sign, as encode_long.
      uint64_t u = static_cast<uint64_t>(v);
      size_t n = 8;
      while (n > 1) {
        unsigned last = (u >> (8 * (n - 1))) & 0xff, next = (u >> (8 * (n - 2))) & 0xff;
        if (!((last == 0x00 && !(next & 0x80)) || (last == 0xff && (next & 0x80)))) break;
        --n;
      }
      byte(0x8a), le(n, 1), le(u, n);
    }
  }
  void items(const std::vector<ValuePtr>& items, size_t depth) {
    for (const auto& item : items) write(item, depth + 1);
  }
  void tuple_of(const std::vector<ValuePtr>& values, size_t depth) {
    if (values.empty()) {
      byte(')');
    } else if (values.size() <= 3) {
      items(values, depth);
      byte(0x84 + values.size());  // TUPLE1..3
    } else {
      byte('(');
      items(values, depth);
      byte('t');
    }
  }
  void pairs(const Value& v, size_t depth) {
    if (v.dict.empty()) return;
    byte('(');
    for (const auto& kv : v.dict) write(kv.first, depth + 1), write(kv.second, depth + 1);
    byte('u');  // SETITEMS
  }
  void write(const ValuePtr& p, size_t depth) {
    if (!p) fail("a null ValuePtr in the tree; write py::none() for Python's None");
    if (depth > kMaxWriteDepth) {
      fail("the value nests more than " + std::to_string(kMaxWriteDepth) + " levels deep");
    }
    const Value& v = *p;
    if (auto it = memo_.find(&v); it != memo_.end()) {
      if (it->second < 256) {
        byte('h'), le(it->second, 1);
      } else {
        byte('j'), le(it->second, 4);
      }
      return;
    }
    switch (v.kind) {
      case Kind::kNone:
        byte('N');
        return;
      case Kind::kBool:
        byte(v.b ? 0x88 : 0x89);
        return;
      case Kind::kInt:
        integer(v.i);
        return;
      case Kind::kFloat: {
        uint64_t u;
        std::memcpy(&u, &v.f, sizeof u);
        byte('G');
        for (int k = 7; k >= 0; --k) byte((u >> (8 * k)) & 0xff);
        return;
      }
      case Kind::kStr:
        if (!valid_utf8(v.s)) fail("a str that is not valid UTF-8: '" + quote(v.s) + "'");
        sized(v.s, 0x8c, 'X', 0x8d);
        break;
      case Kind::kBytes:
        sized(v.s, 'C', 'B', 0x8e);
        break;
      case Kind::kTuple:
        tuple_of(v.items, depth);
        break;
      case Kind::kList:
        byte(']');
        if (!v.items.empty()) byte('('), items(v.items, depth), byte('e');  // APPENDS
        break;
      case Kind::kDict:
        byte('}');
        pairs(v, depth);
        break;
      case Kind::kGlobal:
        sized(v.module, 0x8c, 'X', 0x8d);
        sized(v.name, 0x8c, 'X', 0x8d);
        byte(0x93);  // STACK_GLOBAL
        break;
      case Kind::kObject:
      case Kind::kCall:
        if (!v.callable || v.callable->kind != Kind::kGlobal) {
          fail("a " + describe(v) + " whose class or function is " +
               (v.callable ? "a " + describe(*v.callable) : "missing") +
               "; it must be a py::global()");
        }
        write(v.callable, depth + 1);
        tuple_of(v.items, depth + 1);  // the arguments' tuple is one level, as in Python
        byte(v.kind == Kind::kObject ? 0x81 : 'R');  // NEWOBJ or REDUCE
        pairs(v, depth);
        if (v.state) write(v.state, depth + 1), byte('b');  // BUILD
        break;
    }
    // A value held elsewhere too may appear again in this tree: write it once (a DAG with
    // much sharing would otherwise grow exponentially), and BINGET it later.
    if (p.use_count() > 1) {
      memo_.emplace(&v, memo_.size());
      byte(0x94);  // MEMOIZE
    }
  }

  std::string out_;
  std::unordered_map<const Value*, uint64_t> memo_;
};

}  // namespace

std::string write(const ValuePtr& value) { return Writer().run(value); }

}  // namespace py
}  // namespace detail
}  // namespace ddp
