// Fuzz target: ddprun's control-channel messages, tools/ddprun/wire.{h,cpp}.
//
// The input is what a peer sends: it is cut into lines at '\n' as
// Connection::read_lines does (the last piece too), and each line is decoded both as
// an agent's message and as node 0's. A message that decodes must encode to a line
// (non-empty, no newline) that decodes to the same message, and encoding that gives the
// same line. Compared as the receiver acts on them: an Exit with code 0 is sent as
// `done`, without node or why; and an agent's --nnodes range counts only when
// 0 < MIN < MAX (as the encoder writes it; the decoder also takes MIN >= MAX).
#include "wire.h"

#include <cstdint>
#include <string>

#include "fuzz_check.h"

using namespace ddprun;

namespace {

int effective_min(const Introduction& h) {
  return h.min_nodes > 0 && h.min_nodes < h.nnodes ? h.min_nodes : h.nnodes;
}

std::string agent_difference(const AgentMessage& a, const AgentMessage& b) {
  if (a.kind != b.kind) return "kind";
  switch (a.kind) {
    case AgentMessage::Invalid:
    case AgentMessage::Ping:
      return "";
    case AgentMessage::Hello:
      if (a.hello.node != b.hello.node || a.hello.nnodes != b.hello.nnodes ||
          a.hello.nproc != b.hello.nproc || a.hello.run_id != b.hello.run_id ||
          effective_min(a.hello) != effective_min(b.hello))
        return "hello";
      return "";
    case AgentMessage::Rejoining:
      if (a.rejoin.node != b.rejoin.node || a.rejoin.attempt != b.rejoin.attempt ||
          a.rejoin.run_id != b.rejoin.run_id)
        return "rejoin";
      return "";
    case AgentMessage::Report:
      if (a.event.kind != b.event.kind || a.event.node != b.event.node ||
          a.event.attempt != b.event.attempt || a.event.code != b.event.code ||
          a.event.why != b.event.why)
        return "event";
      return "";
  }
  return "unknown kind";
}

std::string node0_difference(const Node0Message& a, const Node0Message& b) {
  if (a.kind != b.kind) return "kind";
  switch (a.kind) {
    case Node0Message::Invalid:
    case Node0Message::Ping:
      return "";
    case Node0Message::Welcome:
      return a.node == b.node ? "" : "node";
    case Node0Message::Refusal:
      return a.refusal == b.refusal ? "" : "refusal";
    case Node0Message::PeerList:
      return a.peers == b.peers ? "" : "peers";
    case Node0Message::Order: {
      Decision x = a.decision, y = b.decision;
      if (x.kind == Decision::Exit && x.code == 0) x.node = -1, x.why.clear();
      if (x.kind != y.kind || x.attempt != y.attempt || x.code != y.code || x.node != y.node ||
          x.run_id != y.run_id || x.restarts != y.restarts || x.why != y.why ||
          x.error != y.error || x.members != y.members)
        return "decision";
      return "";
    }
  }
  return "unknown kind";
}

void check_line(const std::string& line) {
  const AgentMessage a = decode_agent_message(line);
  if (a.kind != AgentMessage::Invalid) {
    const std::string encoded = encode(a);
    FUZZ_CHECK(!encoded.empty() && encoded.find('\n') == std::string::npos,
               "agent message from '" + ddp_fuzz::escaped(line) + "' encodes to '" +
                   ddp_fuzz::escaped(encoded) + "'");
    const AgentMessage back = decode_agent_message(encoded);
    const std::string diff = agent_difference(a, back);
    FUZZ_CHECK(diff.empty(), "agent line '" + ddp_fuzz::escaped(line) + "' -> '" +
                                 ddp_fuzz::escaped(encoded) + "' reads back with another " + diff);
    FUZZ_CHECK(encode(back) == encoded,
               "agent line '" + ddp_fuzz::escaped(encoded) + "' re-encodes differently");
  }
  const Node0Message n = decode_node0_message(line);
  if (n.kind != Node0Message::Invalid) {
    const std::string encoded = encode(n);
    FUZZ_CHECK(!encoded.empty() && encoded.find('\n') == std::string::npos,
               "node 0 message from '" + ddp_fuzz::escaped(line) + "' encodes to '" +
                   ddp_fuzz::escaped(encoded) + "'");
    const Node0Message back = decode_node0_message(encoded);
    const std::string diff = node0_difference(n, back);
    FUZZ_CHECK(diff.empty(), "node 0 line '" + ddp_fuzz::escaped(line) + "' -> '" +
                                 ddp_fuzz::escaped(encoded) + "' reads back with another " + diff);
    FUZZ_CHECK(encode(back) == encoded,
               "node 0 line '" + ddp_fuzz::escaped(encoded) + "' re-encodes differently");
  }
  // split_words: at most max_words words, none empty.
  for (size_t max_words : {1, 2, 3, 6}) {
    const auto words = split_words(line, max_words);
    FUZZ_CHECK(words.size() <= max_words, "split_words returned too many words");
    for (const auto& w : words) FUZZ_CHECK(!w.empty(), "split_words returned an empty word");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  size_t pos = 0;
  for (;;) {
    const size_t nl = in.find('\n', pos);
    check_line(in.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos));
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  return 0;
}
