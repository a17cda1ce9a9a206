// The Python pickle reader and writer (src/formats/py_pickle.h), with no LibTorch: round trips,
// Python's own pickler and torch.distributed.checkpoint on the other side (through
// python/py_pickle_peer.py), and hostile input: every refusal's message, every truncation and
// byte flips of a real checkpoint's metadata.

#include "formats/py_pickle.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

namespace py = ddp::detail::py;
using py::Kind;
using py::ValuePtr;

namespace {

// What a DCP `.metadata` names (torch 2.x). builtins.getattr is here because pickle writes an
// Enum member as getattr(cls, name); the reader runs nothing, so a name is harmless.
bool dcp_allowed(const std::string& module, const std::string& name) {
  static const std::set<std::pair<std::string, std::string>> names = {
      {"torch.distributed.checkpoint.metadata", "Metadata"},
      {"torch.distributed.checkpoint.metadata", "TensorStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "BytesStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "TensorProperties"},
      {"torch.distributed.checkpoint.metadata", "MetadataIndex"},
      {"torch.distributed.checkpoint.metadata", "StorageMeta"},
      {"torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"},
      {"torch.distributed.checkpoint.filesystem", "_StorageInfo"},
      {"torch", "Size"},
      {"torch", "float32"},
      {"torch", "int64"},
      {"torch.serialization", "_get_layout"},
      {"builtins", "getattr"},
      {"pathlib", "PosixPath"},
      {"collections", "OrderedDict"},
      {"__main__", "Point"},
      {"copyreg", "_reconstructor"},
      {"builtins", "object"},
      {"_codecs", "encode"},
  };
  return names.count({module, name}) > 0;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t k = 0; k + 1 < hex.size(); k += 2) {
    out += static_cast<char>(std::stoi(hex.substr(k, 2), nullptr, 16));
  }
  return out;
}

// The `.metadata` that torch 2.15's torch.distributed.checkpoint.save wrote for
// {"w": float32 [2, 3], "b": int64 [4], "step": 7, "name": "hi"} in /tmp/ckpt
// (pickle protocol 4, framed, memoized; Python 3.11).
const std::string& real_metadata() {
  static const std::string bytes = from_hex(
      "8004959a040000000000008c25746f7263682e64697374726962757465642e636865636b706f696e742e6d657461"
      "64617461948c084d657461646174619493942981947d94288c1373746174655f646963745f6d6574616461746194"
      "7d94288c01779468008c1554656e736f7253746f726167654d657461646174619493942981947d94288c0a70726f"
      "706572746965739468008c1054656e736f7250726f70657274696573949394298194288c05746f726368948c0766"
      "6c6f617433329493948c13746f7263682e73657269616c697a6174696f6e948c0b5f6765745f6c61796f75749493"
      "948c0d746f7263682e737472696465649485945294898c086275696c74696e73948c076765746174747294939468"
      "008c145f4d454d5f464f524d41545f454e434f44494e479493948c17544f5243485f434f4e544947554f55535f46"
      "4f524d41549486945294894b034b0186947494628c0473697a65948c05746f726368948c0453697a659493944b02"
      "4b038694859452948c066368756e6b73945d9468008c144368756e6b53746f726167654d65746164617461949394"
      "2981947d94288c076f6666736574739468264b004b008694859452948c0573697a65739468264b024b0386948594"
      "529475626175628c01629468092981947d9428680c680e2981942868108c05696e7436349493946818896820894b"
      "018594749462682368264b04859485945294682a5d94682d2981947d9428683068264b0085948594529468346826"
      "4b0485948594529475626175628c04737465709468008c14427974657353746f726167654d657461646174619493"
      "942981948c046e616d6594684e298194758c0c706c616e6e65725f64617461947d94286807680785946838683885"
      "94684c684c8594685068508594758c0c73746f726167655f64617461947d942868008c0d4d65746164617461496e"
      "6465789493942981947d94288c0366716e94684c8c05696e646578944e75628c27746f7263682e64697374726962"
      "757465642e636865636b706f696e742e66696c6573797374656d948c0c5f53746f72616765496e666f9493942981"
      "947d94288c0d72656c61746976655f70617468948c0c5f5f305f302e646973746370948c066f6666736574944b00"
      "8c066c656e677468944ded047562685b2981947d9428685e6850685f4e756268622981947d94286865686668674d"
      "ed0468684ded047562685b2981947d9428685e6807685f4b00686768264b004b0086948594529475626862298194"
      "7d94286865686668674dda0968684d29067562685b2981947d9428685e6838685f4b00686768264b008594859452"
      "94756268622981947d94286865686668674d031068684d29067562758c0c73746f726167655f6d6574619468008c"
      "0b53746f726167654d6574619493942981947d94288c0d636865636b706f696e745f6964948c07706174686c6962"
      "948c09506f736978506174689493948c012f948c03746d70948c04636b707494879452948c07736176655f696494"
      "8c2466613738323938322d643566352d346534632d393561332d396262343932353765343930948c076c6f61645f"
      "6964944e8c076d6f64756c6573945d9475628c0776657273696f6e948c05312e302e309475622e");
  return bytes;
}

// The message of the runtime_error that reading `bytes` throws ("" if it throws none).
std::string read_error(const std::string& bytes, const py::ReadLimits& limits = {}) {
  try {
    py::read(bytes, dcp_allowed, "load('x/.metadata')", limits);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_REFUSED(bytes, substring)                           \
  do {                                                             \
    std::string _msg = read_error(bytes);                          \
    EXPECT_EQ(_msg.rfind("load('x/.metadata'): ", 0), 0u) << _msg; \
    EXPECT_NE(_msg.find(substring), std::string::npos) << _msg;    \
  } while (0)

ValuePtr roundtrip(const ValuePtr& v) { return py::read(py::write(v), dcp_allowed, "rt"); }

// Structural equality; floats by bits (so -0.0 and nan compare as written).
bool same(const ValuePtr& a, const ValuePtr& b) {
  if (!a || !b) return !a && !b;
  if (a->kind != b->kind) return false;
  switch (a->kind) {
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return a->b == b->b;
    case Kind::kInt:
      return a->i == b->i;
    case Kind::kFloat:
      return std::memcmp(&a->f, &b->f, sizeof(double)) == 0;
    case Kind::kStr:
    case Kind::kBytes:
      return a->s == b->s;
    case Kind::kGlobal:
      return a->module == b->module && a->name == b->name;
    default:
      break;
  }
  if (a->items.size() != b->items.size() || a->dict.size() != b->dict.size()) return false;
  for (size_t k = 0; k < a->items.size(); ++k) {
    if (!same(a->items[k], b->items[k])) return false;
  }
  for (size_t k = 0; k < a->dict.size(); ++k) {
    if (!same(a->dict[k].first, b->dict[k].first) || !same(a->dict[k].second, b->dict[k].second))
      return false;
  }
  return same(a->callable, b->callable) && same(a->state, b->state);
}

ValuePtr ints(std::vector<int64_t> values) {
  std::vector<ValuePtr> items;
  for (int64_t v : values) items.push_back(py::integer(v));
  return py::list(std::move(items));
}
ValuePtr size(std::vector<int64_t> dims) {
  std::vector<ValuePtr> items;
  for (int64_t d : dims) items.push_back(py::integer(d));
  return py::call(py::global("torch", "Size"), {py::tuple(std::move(items))});
}
const char* kMeta = "torch.distributed.checkpoint.metadata";

// ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes)), as pickle writes it.
ValuePtr chunk(std::vector<int64_t> offsets, std::vector<int64_t> sizes) {
  return py::object(py::global(kMeta, "ChunkStorageMetadata"), {},
                    py::dict({{py::str("offsets"), size(std::move(offsets))},
                              {py::str("sizes"), size(std::move(sizes))}}));
}

// TensorProperties' __getstate__ tuple: (dtype, layout, requires_grad, memory format as an
// _MEM_FORMAT_ENCODING member, pin_memory, strides).
ValuePtr tensor_properties(const char* dtype, std::vector<int64_t> strides) {
  std::vector<ValuePtr> s;
  for (int64_t v : strides) s.push_back(py::integer(v));
  return py::object(py::global(kMeta, "TensorProperties"), {},
                    py::tuple({py::global("torch", dtype),
                               py::call(py::global("torch.serialization", "_get_layout"),
                                        {py::str("torch.strided")}),
                               py::boolean(false),
                               py::call(py::global("builtins", "getattr"),
                                        {py::global(kMeta, "_MEM_FORMAT_ENCODING"),
                                         py::str("TORCH_CONTIGUOUS_FORMAT")}),
                               py::boolean(false), py::tuple(std::move(s))}));
}

// A DCP-like tree: a Metadata with one tensor entry and one bytes entry.
ValuePtr dcp_like() {
  ValuePtr w = py::object(py::global(kMeta, "TensorStorageMetadata"), {},
                          py::dict({{py::str("properties"), tensor_properties("float32", {3, 1})},
                                    {py::str("size"), size({2, 3})},
                                    {py::str("chunks"), py::list({chunk({0, 0}, {2, 3})})}}));
  ValuePtr step = py::object(py::global(kMeta, "BytesStorageMetadata"), {}, nullptr);
  ValuePtr sd = py::dict({{py::str("w"), w}, {py::str("step"), step}});
  return py::object(py::global(kMeta, "Metadata"), {},
                    py::dict({{py::str("state_dict_metadata"), sd},
                              {py::str("planner_data"), py::none()},
                              {py::str("storage_data"), py::dict({})},
                              {py::str("version"), py::str("1.0.0")}}));
}

std::vector<int64_t> size_dims(const ValuePtr& v) {
  EXPECT_TRUE(v && v->kind == Kind::kCall && v->callable->name == "Size") << py::describe(*v);
  std::vector<int64_t> out;
  for (const auto& d : v->items.at(0)->items) out.push_back(d->i);
  return out;
}

}  // namespace

TEST(PyPickle, RoundTripsEveryKind) {
  const int64_t min = std::numeric_limits<int64_t>::min(),
                max = std::numeric_limits<int64_t>::max();
  const double inf = std::numeric_limits<double>::infinity();
  ValuePtr shared = py::list({py::integer(1)});
  ValuePtr tree = py::dict({
      {py::str("ints"), ints({0,
                              1,
                              255,
                              256,
                              65535,
                              65536,
                              -1,
                              -255,
                              -256,
                              -65536,
                              INT32_MIN,
                              INT32_MAX,
                              int64_t{INT32_MAX} + 1,
                              int64_t{INT32_MIN} - 1,
                              int64_t{1} << 40,
                              -(int64_t{1} << 40),
                              int64_t{1} << 55,
                              -(int64_t{1} << 56),
                              min,
                              max,
                              min + 1,
                              max - 1})},
      {py::str("floats"), py::list({py::real(0.0), py::real(-0.0), py::real(inf), py::real(-inf),
                                    py::real(std::nan("")), py::real(1e-310), py::real(1.5)})},
      {py::str("unicode"), py::str("h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9f\x98\x80")},
      {py::str(std::string(300, 'x')), py::bytes(std::string("a\0b\xff", 4))},
      {py::str("long bytes"), py::bytes(std::string(70000, '\0'))},
      {py::str("empty"),
       py::tuple({py::tuple({}), py::list({}), py::dict({}), py::str(""), py::bytes("")})},
      {py::str("tuples"),
       py::list({py::tuple({py::none()}), py::tuple({py::boolean(true), py::boolean(false)}),
                 py::tuple({py::none(), py::none(), py::none()}),
                 py::tuple({py::none(), py::none(), py::none(), py::none()})})},
      {py::integer(5), py::list({py::list({py::list({py::dict({{py::none(), py::none()}})})})})},
      {py::str("shared"), py::list({shared, shared, shared})},
      {py::str("metadata"), dcp_like()},
      {py::str("ordered"), py::call(py::global("collections", "OrderedDict"), {})},
  });
  ValuePtr back = roundtrip(tree);
  EXPECT_TRUE(same(tree, back));
  // One list referenced three times is one node after reading, as it is one object in Python.
  ValuePtr s = py::find(*back, "shared");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->items[0].get(), s->items[1].get());
  EXPECT_EQ(s->items[0].get(), s->items[2].get());
  EXPECT_TRUE(std::signbit(py::find(*back, "floats")->items[1]->f));
  EXPECT_TRUE(std::isnan(py::find(*back, "floats")->items[4]->f));
  for (const ValuePtr& v : {py::none(), py::boolean(true), py::integer(min), py::real(-0.0),
                            py::str(""), py::bytes(std::string(1, '\0'))}) {
    EXPECT_TRUE(same(v, roundtrip(v))) << py::describe(*v);
  }
}

TEST(PyPickle, WritesPythonsIntegerOpcodes) {
  // BININT1, BININT2, BININT, then LONG1 with the fewest bytes, as Python's pickler.
  EXPECT_EQ(py::write(py::integer(255)), std::string("\x80\x04K\xff.", 5));
  EXPECT_EQ(py::write(py::integer(256)), std::string("\x80\x04M\x00\x01.", 6));
  EXPECT_EQ(py::write(py::integer(-1)), std::string("\x80\x04J\xff\xff\xff\xff.", 8));
  EXPECT_EQ(py::write(py::integer(int64_t{1} << 31)),
            std::string("\x80\x04\x8a\x05\x00\x00\x00\x80\x00.", 10));
  EXPECT_EQ(py::write(py::integer(-(int64_t{1} << 39))),
            std::string("\x80\x04\x8a\x05\x00\x00\x00\x00\x80.", 10));
  EXPECT_EQ(py::write(py::integer(std::numeric_limits<int64_t>::min())),
            std::string("\x80\x04\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80.", 13));
}

TEST(PyPickle, ReadsARealCheckpointMetadata) {
  ValuePtr m = py::read(real_metadata(), dcp_allowed, "real");
  ASSERT_EQ(py::describe(*m), std::string("object ") + kMeta + ".Metadata");
  ValuePtr sd = py::find(*m->state, "state_dict_metadata");
  ASSERT_TRUE(sd);
  std::vector<std::string> keys;
  for (const auto& kv : sd->dict) keys.push_back(kv.first->s);
  EXPECT_EQ(keys, (std::vector<std::string>{"w", "b", "step", "name"}));
  ValuePtr w = py::find(*sd, "w");
  EXPECT_EQ(size_dims(py::find(*w->state, "size")), (std::vector<int64_t>{2, 3}));
  ValuePtr c = py::find(*w->state, "chunks")->items.at(0);
  EXPECT_EQ(size_dims(py::find(*c->state, "offsets")), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(size_dims(py::find(*c->state, "sizes")), (std::vector<int64_t>{2, 3}));
  const auto& props = py::find(*w->state, "properties")->state->items;
  ASSERT_EQ(props.size(), 6u);
  EXPECT_EQ(py::describe(*props[0]), "global torch.float32");
  EXPECT_EQ(py::describe(*props[1]), "call torch.serialization._get_layout");
  EXPECT_EQ(py::describe(*props[3]), "call builtins.getattr");
  EXPECT_EQ(props[3]->items.at(1)->s, "TORCH_CONTIGUOUS_FORMAT");
  EXPECT_EQ(props[5]->items.size(), 2u);  // strides (3, 1): a plain tuple
  EXPECT_EQ(py::describe(*py::find(*sd, "step")),
            std::string("object ") + kMeta + ".BytesStorageMetadata");
  // storage_data's keys are MetadataIndex objects, kept as they are.
  ValuePtr storage = py::find(*m->state, "storage_data");
  ASSERT_EQ(storage->dict.size(), 4u);
  EXPECT_EQ(py::describe(*storage->dict[0].first),
            std::string("object ") + kMeta + ".MetadataIndex");
  EXPECT_EQ(py::find(*m->state, "version")->s, "1.0.0");
  // The same tree written by C++ reads back equal.
  EXPECT_TRUE(same(m, roundtrip(m)));
}

TEST(PyPickle, SharedValuesShowLaterChangesThroughEveryReference) {
  // EMPTY_LIST MEMOIZE BINGET 0 BININT1 1 APPEND TUPLE2: (l, l) with l == [1] seen twice.
  ValuePtr t = py::read(std::string("\x80\x04]\x94h\x00K\x01\x61\x86.", 11), dcp_allowed, "t");
  ASSERT_EQ(t->items.size(), 2u);
  EXPECT_EQ(t->items[0].get(), t->items[1].get());
  ASSERT_EQ(t->items[1]->items.size(), 1u);
  EXPECT_EQ(t->items[1]->items[0]->i, 1);
}

TEST(PyPickle, RefusesGlobalsOutsideTheAllowlist) {
  EXPECT_REFUSED("cos\nsystem\n.", "names global 'os.system', which is not among");
  EXPECT_REFUSED("cos\nsystem\n.", "(at byte 0, opcode GLOBAL)");
  EXPECT_REFUSED(std::string("\x80\x04\x8c\x02os\x8c\x06system\x93.", 16),
                 "'os.system', which is not among those this file may hold");
  EXPECT_REFUSED(std::string("\x80\x04\x8c\x02os\x8c\x06system\x93.", 16),
                 "(at byte 14, opcode STACK_GLOBAL)");
  EXPECT_REFUSED("\x80\x02"
                 "cbuiltins\neval\n(S'1'\ntR.",
                 "'builtins.eval'");
  // Python 2's names are Python 3's (fix_imports) before the allowlist sees them.
  EXPECT_REFUSED("\x80\x02"
                 "c__builtin__\neval\n.",
                 "'builtins.eval'");
  EXPECT_REFUSED(std::string("\x80\x04K\x01\x8c\x01x\x93.", 8), "STACK_GLOBAL needs two str");
  // REDUCE only calls a named global, never a value the pickle computed.
  EXPECT_REFUSED(std::string("\x80\x04)\x85)R.", 7), "must be a class or function named");
}

TEST(PyPickle, RefusesOpcodesThatReachOutside) {
  EXPECT_REFUSED("P1\n.", "persistent id");
  EXPECT_REFUSED("N\x51.", "opcode BINPERSID");
  EXPECT_REFUSED("(ios\nsystem\n.", "opcode INST");
  EXPECT_REFUSED("(N\x6f.", "opcode OBJ");
  EXPECT_REFUSED("\x82\x01.", "extension code");
  EXPECT_REFUSED("\x83\x01\x00.", "opcode EXT2");
  EXPECT_REFUSED(std::string("\x84\x01\x00\x00\x00.", 6), "opcode EXT4");
  EXPECT_REFUSED("\x80\x05\x97.", "out-of-band buffer");
  EXPECT_REFUSED("\x80\x04\xff.", "unknown opcode");
  EXPECT_REFUSED("\x80\x04\xff.", "(at byte 2, opcode 0xff)");
  EXPECT_REFUSED("\x80\x06N.", "protocol 6");
}

TEST(PyPickle, RefusesMalformedInput) {
  EXPECT_REFUSED("", "ends before its STOP opcode");
  EXPECT_REFUSED(std::string("\x80\x04X\x10\x00\x00\x00"
                             "abc.",
                             11),
                 "16 byte(s) of str follow, but only 4 remain");
  EXPECT_REFUSED(std::string("\x80\x04\x8b\xff\xff\xff\x7f.", 8), "2147483647 byte(s)");
  EXPECT_REFUSED(std::string("\x80\x04\x8b\xff\xff\xff\xff.", 8), "negative length");
  EXPECT_REFUSED(std::string("\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\xff.", 12),
                 "18446744073709551615 byte(s) of bytes");
  EXPECT_REFUSED(std::string("\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7fN.", 13), "a frame of");
  EXPECT_REFUSED(std::string("\x80\x04\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.", 14),
                 "past the 64 bits");
  EXPECT_REFUSED(std::string("\x80\x04h\x03.", 5), "memo entry 3, which it never stored");
  EXPECT_REFUSED("\x80\x04s.", "the stack is empty");
  EXPECT_REFUSED("\x80\x04(s.", "the stack is empty");  // a MARK hides what is below it
  EXPECT_REFUSED("\x80\x04Nt.", "no MARK is open");
  EXPECT_REFUSED("\x80\x04N.N", "1 byte(s) follow the STOP");
  EXPECT_REFUSED(std::string("\x80\x04X\x02\x00\x00\x00\xc3\x28.", 10), "not valid UTF-8");
  EXPECT_REFUSED("\x80\x04}(NNNu.", "odd number of values");
  EXPECT_REFUSED("\x80\x04]}b.", "BUILD needs an object");
  EXPECT_REFUSED("\x80\x04}Na.", "APPEND needs a list");
  EXPECT_REFUSED("I12x\n.", "where a decimal integer was expected");
  EXPECT_REFUSED("I99999999999999999999\n.", "past 64 bits");
  EXPECT_REFUSED("S'abc\n.", "must be quoted");
}

TEST(PyPickle, RefusesValuesThatContainThemselves) {
  // l = []; l.append(l): EMPTY_LIST MEMOIZE BINGET 0 APPEND.
  EXPECT_REFUSED(std::string("\x80\x04]\x94h\x00\x61.", 7), "puts a list inside itself");
  // d = {}; d[1] = d.
  EXPECT_REFUSED(std::string("\x80\x04}\x94K\x01h\x00s.", 9), "puts a dict inside itself");
  // a = []; t = (a,); a.append(t): a list changed once it is inside another value.
  EXPECT_REFUSED(std::string("\x80\x04]\x94\x85h\x00K\x01\x61.", 10),
                 "after placing it inside another value");
}

TEST(PyPickle, RefusesNestingAndSizePastTheLimits) {
  const size_t n = 100000;
  std::string lists = "\x80\x04" + std::string(n, ']') + std::string(n - 1, 'a') + ".";
  EXPECT_REFUSED(lists, "nest more than 200 levels deep");
  EXPECT_REFUSED("\x80\x04" + std::string(n, '(') + ".", "MARKs nest more than 200 levels");
  std::string tuples = "\x80\x04N" + std::string(n, '\x85') + ".";  // ((((None,),),),...)
  EXPECT_REFUSED(tuples, "nest more than 200 levels deep");
  py::ReadLimits small;
  small.max_depth = 3;
  EXPECT_EQ(read_error("\x80\x04]]]aa.", small), "");
  EXPECT_NE(read_error("\x80\x04]]]]aaa.", small).find("more than 3 levels"), std::string::npos);
  small.max_items = 10;
  EXPECT_NE(read_error("\x80\x04(" + std::string(20, 'N') + "l.", small).find("max_items"),
            std::string::npos);
}

TEST(PyPickle, WriterRefusesWhatPythonCouldNotRead) {
  ValuePtr deep = py::none();
  for (int k = 0; k < 2000; ++k) deep = py::list({deep});
  EXPECT_THROW(py::write(deep), std::runtime_error);
  EXPECT_THROW(py::write(py::str("\xff")), std::runtime_error);
  EXPECT_THROW(py::write(py::object(py::str("x"), {}, nullptr)), std::runtime_error);
  EXPECT_THROW(py::write(py::list({nullptr})), std::runtime_error);
  // A tree far deeper than the stack could recurse frees without recursing.
  ValuePtr very_deep = py::none();
  for (int k = 0; k < 1000000; ++k) very_deep = py::list({very_deep});
  very_deep.reset();
}

TEST(PyPickle, EveryTruncationThrows) {
  for (const std::string& full : {real_metadata(), py::write(dcp_like())}) {
    ASSERT_EQ(read_error(full), "");
    for (size_t n = 0; n < full.size(); ++n) {
      EXPECT_NE(read_error(full.substr(0, n)), "") << "prefix of " << n << " bytes";
    }
  }
}

TEST(PyPickle, ByteFlipsParseOrThrow) {
  // Each must either parse or throw runtime_error: never crash, hang or throw anything else.
  for (const std::string& full : {real_metadata(), py::write(dcp_like())}) {
    size_t parsed = 0, refused = 0;
    for (size_t at = 0; at < full.size(); ++at) {
      for (int change : {0, 1, 2}) {
        std::string bytes = full;
        bytes[at] = change == 0 ? '\0' : change == 1 ? '\xff' : static_cast<char>(bytes[at] + 1);
        read_error(bytes).empty() ? ++parsed : ++refused;
      }
    }
    EXPECT_GT(refused, 0u);
    EXPECT_GT(parsed, 0u);  // flips inside strings and numbers still parse
  }
}

// ---------------------------------------------------------------------------------------------
// Against Python itself (python/py_pickle_peer.py)

namespace {

std::string python() {
  if (const char* p = std::getenv("DDP_TEST_PYTHON")) return p;
#ifdef DDP_TEST_PYTHON
  return DDP_TEST_PYTHON;
#else
  return "python3";
#endif
}
std::string peer() {
  if (const char* p = std::getenv("DDP_PICKLE_PEER")) return p;
#ifdef DDP_PICKLE_PEER
  return DDP_PICKLE_PEER;
#else
  return "tests/formats_light/python/py_pickle_peer.py";
#endif
}

struct PeerRun {
  int rc;
  std::string out;
};
PeerRun run_peer(const std::string& args) {
  std::string cmd = "'" + python() + "' -B '" + peer() + "' " + args + " 2>&1";
  PeerRun r{-1, ""};
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  int status = pclose(f);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string temp_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "py_pickle_XXXXXX").string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
  return pattern;
}
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
void spill(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// bytes as Python writes them at each protocol: b"..." before protocol 3 is
// _codecs.encode("...", "latin1").
std::string bytes_of(const ValuePtr& v) {
  if (v->kind == Kind::kBytes) return v->s;
  EXPECT_EQ(py::describe(*v), "call _codecs.encode");
  std::string out;  // the str is the bytes as Latin-1, in UTF-8
  const std::string& s = v->items.at(0)->s;
  for (size_t k = 0; k < s.size(); ++k) {
    unsigned char c = s[k];
    out += c < 0x80 ? static_cast<char>(c) : static_cast<char>(((c & 0x03) << 6) | (s[++k] & 0x3f));
  }
  return out;
}

}  // namespace

TEST(PyPicklePython, ReadsWhatPythonWrites) {
  std::string dir = temp_dir();
  PeerRun r = run_peer("dumps '" + dir + "'");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (int protocol = 0; protocol <= 5; ++protocol) {
    SCOPED_TRACE("protocol " + std::to_string(protocol));
    ValuePtr v =
        py::read(slurp(dir + "/plain_p" + std::to_string(protocol) + ".pkl"), dcp_allowed, "plain");
    ValuePtr i = py::find(*v, "ints");
    ASSERT_TRUE(i);
    std::vector<int64_t> got;
    for (const auto& x : i->items) got.push_back(x->i);
    EXPECT_EQ(got, (std::vector<int64_t>{0, 255, 256, 65535, 65536, -1, INT32_MIN, INT32_MAX,
                                         int64_t{INT32_MAX} + 1, int64_t{INT32_MIN} - 1,
                                         std::numeric_limits<int64_t>::max(),
                                         std::numeric_limits<int64_t>::min()}));
    const auto& f = py::find(*v, "floats")->items;
    ASSERT_EQ(f.size(), 5u);
    EXPECT_EQ(f[0]->f, 1.5);
    EXPECT_TRUE(std::signbit(f[1]->f) && f[1]->f == 0);
    EXPECT_EQ(f[2]->f, std::numeric_limits<double>::infinity());
    EXPECT_EQ(f[3]->f, -std::numeric_limits<double>::infinity());
    EXPECT_EQ(f[4]->f, 1e-310);
    EXPECT_EQ(py::find(*v, "str")->s, "h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9f\x98\x80");
    EXPECT_EQ(bytes_of(py::find(*v, "bytes")), std::string("a\0b\xff", 4));
    EXPECT_EQ(py::find(*v, "none")->kind, Kind::kNone);
    const auto& bools = py::find(*v, "bools")->items;
    EXPECT_TRUE(bools.at(0)->kind == Kind::kBool && bools[0]->b);
    EXPECT_TRUE(bools.at(1)->kind == Kind::kBool && !bools[1]->b);
    const auto& tuples = py::find(*v, "tuples")->items;
    ASSERT_EQ(tuples.size(), 5u);
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_EQ(tuples[k]->kind, Kind::kTuple);
      EXPECT_EQ(tuples[k]->items.size(), k);
    }
    ValuePtr nested = py::find(*v, "nested");
    EXPECT_EQ(nested->items.at(2)->items.at(0)->items.at(0)->i, 1);
    ValuePtr shared = py::find(*v, "shared");
    EXPECT_EQ(shared->items.at(0).get(), shared->items.at(1).get());
    ValuePtr point = py::find(*v, "point");
    // NEWOBJ from protocol 2; copyreg._reconstructor(Point, object, None) before.
    EXPECT_EQ(py::describe(*point),
              protocol >= 2 ? "object __main__.Point" : "call copyreg._reconstructor");
    EXPECT_EQ(py::find(*point->state, "x")->i, 3);
    EXPECT_EQ(py::find(*point->state, "y")->items.at(0)->i, 4);
    ValuePtr ordered = py::find(*v, "ordered");
    EXPECT_EQ(py::describe(*ordered), "call collections.OrderedDict");
    ASSERT_EQ(ordered->dict.size(), 2u);
    EXPECT_EQ(ordered->dict[0].first->s, "b");
    EXPECT_EQ(ordered->dict[1].second->i, 2);
    EXPECT_EQ(v->dict.back().first->i, 7);
    EXPECT_EQ(v->dict.back().second->s, "int key");
  }
  std::filesystem::remove_all(dir);
}

TEST(PyPicklePython, PythonReadsWhatCppWrites) {
  std::string dir = temp_dir();
  const double inf = std::numeric_limits<double>::infinity();
  ValuePtr shared = py::list({py::integer(1)});
  std::string long_bytes;
  for (int k = 0; k < 512; ++k) long_bytes += static_cast<char>(k & 0xff);
  ValuePtr tree = py::dict({
      {py::str("ints"),
       ints({0, 1, 255, 256, 65535, 65536, -1, -256, INT32_MIN, INT32_MAX, int64_t{INT32_MAX} + 1,
             int64_t{INT32_MIN} - 1, int64_t{1} << 40, -(int64_t{1} << 40),
             std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()})},
      {py::str("floats"), py::tuple({py::real(1.5), py::real(-0.0), py::real(inf), py::real(-inf),
                                     py::real(std::nan(""))})},
      {py::str("str"), py::str("h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9f\x98\x80")},
      {py::str("long"), py::str(std::string(300, 'x'))},
      {py::str("bytes"), py::bytes(std::string("a\0b\xff", 4))},
      {py::str("long_bytes"), py::bytes(long_bytes)},
      {py::str("none"), py::none()},
      {py::str("bools"), py::list({py::boolean(true), py::boolean(false)})},
      {py::str("tuples"),
       py::tuple({py::tuple({}), py::tuple({py::integer(1)}),
                  py::tuple({py::integer(1), py::integer(2)}),
                  py::tuple({py::integer(1), py::integer(2), py::integer(3)}),
                  py::tuple({py::integer(1), py::integer(2), py::integer(3), py::integer(4)})})},
      {py::str("nested"), py::list({py::list({}), py::dict({}), py::tuple({}),
                                    py::list({py::list({py::integer(1)})})})},
      {py::str("shared"), py::list({shared, shared})},
      {py::str("point"), py::object(py::global("__main__", "Point"), {},
                                    py::dict({{py::str("x"), py::integer(1)},
                                              {py::str("y"), py::list({py::integer(2)})}}))},
      {py::str("date"), py::call(py::global("datetime", "date"),
                                 {py::integer(2024), py::integer(1), py::integer(31)})},
      {py::integer(5), py::str("int key")},
  });
  spill(dir + "/plain.pkl", py::write(tree));
  PeerRun r = run_peer("loads plain '" + dir + "/plain.pkl'");
  EXPECT_EQ(r.rc, 0) << r.out;

  // Real DCP classes: ChunkStorageMetadata, TensorStorageMetadata with TensorProperties'
  // __setstate__ tuple, torch.Size, a dtype.
  ValuePtr props = tensor_properties("float32", {3, 1});
  ValuePtr c = chunk({0, 0}, {2, 3});
  ValuePtr dcp = py::dict({
      {py::str("chunk"), c},
      {py::str("tensor"), py::object(py::global(kMeta, "TensorStorageMetadata"), {},
                                     py::dict({{py::str("properties"), props},
                                               {py::str("size"), size({2, 3})},
                                               {py::str("chunks"), py::list({c})}}))},
      {py::str("dtype"), py::global("torch", "int64")},
  });
  spill(dir + "/dcp.pkl", py::write(dcp));
  r = run_peer("loads dcp '" + dir + "/dcp.pkl'");
  std::filesystem::remove_all(dir);
  if (r.rc == 77) GTEST_SKIP() << r.out;
  EXPECT_EQ(r.rc, 0) << r.out;
}

TEST(PyPicklePython, ReadsWhatCheckpointSaveWrites) {
  std::string dir = temp_dir();
  PeerRun r = run_peer("dcp '" + dir + "'");
  if (r.rc == 77) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << r.out;
  }
  ASSERT_EQ(r.rc, 0) << r.out;
  ValuePtr m = py::read(slurp(dir + "/.metadata"), dcp_allowed, dir + "/.metadata");
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(m->state) << py::describe(*m);
  ValuePtr sd = py::find(*m->state, "state_dict_metadata");
  ASSERT_TRUE(sd);
  std::vector<std::string> keys;
  for (const auto& kv : sd->dict) keys.push_back(kv.first->s);
  EXPECT_EQ(keys, (std::vector<std::string>{"w", "b", "step", "name"}));
  for (const char* name : {"step", "name"}) {
    EXPECT_EQ(py::describe(*py::find(*sd, name)),
              std::string("object ") + kMeta + ".BytesStorageMetadata");
  }
  ValuePtr b = py::find(*sd, "b");
  EXPECT_EQ(size_dims(py::find(*b->state, "size")), (std::vector<int64_t>{4}));
  ValuePtr chunk0 = py::find(*b->state, "chunks")->items.at(0);
  EXPECT_EQ(size_dims(py::find(*chunk0->state, "sizes")), (std::vector<int64_t>{4}));
  // TensorProperties: a __setstate__ tuple whose first entry is the dtype.
  ValuePtr props = py::find(*b->state, "properties");
  ASSERT_TRUE(props->state && props->state->kind == Kind::kTuple) << py::describe(*props);
  EXPECT_EQ(py::describe(*props->state->items.at(0)), "global torch.int64");
  ValuePtr w = py::find(*sd, "w");
  EXPECT_EQ(py::describe(*py::find(*w->state, "properties")->state->items.at(0)),
            "global torch.float32");
}
