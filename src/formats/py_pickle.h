#pragma once

// Python pickles as plain trees, with no LibTorch: a reader for pickles that may be hostile
// (PyTorch Distributed Checkpoint's `.metadata`, a pickle of dataclasses) and a writer of
// pickles of the same shape that Python's pickle.loads reads. Nothing read is ever executed:
// a class or function is only a name (Note [Safe pickle reading] in py_pickle.cpp).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddp {
namespace detail {
namespace py {

struct Value;
using ValuePtr = std::shared_ptr<const Value>;

enum class Kind {
  kNone,
  kBool,
  kInt,
  kFloat,
  kStr,
  kBytes,
  kTuple,
  kList,
  kDict,
  kGlobal,
  kObject,
  kCall
};

/// A pickled Python value as a tree. Nothing is ever executed:
///  - kGlobal: a reference to module.name (GLOBAL / STACK_GLOBAL), allowlisted.
///  - kObject: an instance made by NEWOBJ (cls.__new__(cls, *args)) then optionally BUILD(state):
///             `callable` is the class (a kGlobal), `items` are NEWOBJ's args, `state` is the
///             BUILD state (nullptr if no BUILD): a dict for plain objects and dataclasses, or
///             anything (a tuple for classes with __setstate__).
///  - kCall:   the result of REDUCE (callable(*args)): `callable` is a kGlobal, `items` the args.
///             BUILD on a kCall result sets `state` the same way.
/// SETITEMS on a kObject or kCall (an OrderedDict is REDUCE of collections.OrderedDict, then
/// SETITEMS) fills its `dict`. Sets and frozensets (EMPTY_SET, ADDITEMS, FROZENSET) are read as
/// kList. A dict keeps every SETITEM in order, a repeated key included; find() takes the last,
/// as Python's dict does.
struct Value {
  Kind kind = Kind::kNone;
  bool b = false;                                   // kBool
  int64_t i = 0;                                    // kInt (LONG1/LONG4 past 64 bits are refused)
  double f = 0;                                     // kFloat
  std::string s;                                    // kStr (UTF-8), kBytes (raw)
  std::string module, name;                         // kGlobal
  std::vector<ValuePtr> items;                      // kTuple, kList; kObject/kCall args
  std::vector<std::pair<ValuePtr, ValuePtr>> dict;  // kDict, in insertion order
  ValuePtr callable;                                // kObject (the class), kCall (the function)
  ValuePtr state;                                   // kObject/kCall: BUILD's state, or nullptr

  // Frees the children of a deep tree without deep recursion (Note [Iterative teardown]).
  ~Value();
};

/// Constructors for building trees to write.
ValuePtr none();
ValuePtr boolean(bool value);
ValuePtr integer(int64_t value);
ValuePtr real(double value);
ValuePtr str(std::string utf8);
ValuePtr bytes(std::string raw);
ValuePtr tuple(std::vector<ValuePtr> items);
ValuePtr list(std::vector<ValuePtr> items);
ValuePtr dict(std::vector<std::pair<ValuePtr, ValuePtr>> items);
ValuePtr global(std::string module, std::string name);
/// NEWOBJ, then BUILD(state) when `state` is set.
ValuePtr object(ValuePtr cls, std::vector<ValuePtr> args, ValuePtr state);
/// REDUCE, then BUILD(state) when `state` is set.
ValuePtr call(ValuePtr callable, std::vector<ValuePtr> args, ValuePtr state = nullptr);

/// Which module.name pairs a reader accepts.
using Allowlist = std::function<bool(const std::string& module, const std::string& name)>;

struct ReadLimits {
  size_t max_depth = 200;      // nesting of containers/objects in the result and of MARKs
  size_t max_items = 1 << 24;  // total values created
};

/// Parses `bytes` (protocols 0 to 5). Throws std::runtime_error whose message starts with
/// `where` + ": " and says what was wrong, at which byte offset and in which opcode. Refuses
/// any global that `allowed` rejects, every opcode that could run code or reach outside the
/// bytes (PERSID, BINPERSID, INST, OBJ, EXT1/2/4, NEWOBJ_EX, NEXT_BUFFER, READONLY_BUFFER),
/// unknown opcodes, truncated input, lengths past the end, memo indices never stored, stack
/// underflow, a missing MARK, nesting or item counts past `limits`, a container made to hold
/// itself, and bytes after STOP.
ValuePtr read(std::string_view bytes, const Allowlist& allowed, const std::string& where,
              const ReadLimits& limits = ReadLimits());

/// Writes `value` as a protocol 4 pickle (unframed) that Python 3's pickle.loads reads, with
/// the opcodes Python's own pickler uses for each kind. A value referenced more than once is
/// written once and memoized. Throws std::runtime_error on a tree Python could not read back
/// (a str that is not UTF-8, a class that is not a global, nesting past 1000 levels).
std::string write(const ValuePtr& value);

/// The value of key `key` (a kStr key) in kDict `d` (the last such entry), or nullptr when
/// there is none or `d` is not a kDict.
ValuePtr find(const Value& d, const std::string& key);
/// The kind of `v` for messages: "str", "int", "dict", "global torch.float32",
/// "object torch.distributed.checkpoint.metadata.Metadata", "call torch.Size", ...
std::string describe(const Value& v);

}  // namespace py
}  // namespace detail
}  // namespace ddp
