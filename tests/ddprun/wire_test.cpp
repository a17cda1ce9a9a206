// The control channel's messages: the lines are pinned (an older ddprun on
// another host must still understand them), each message reads back as
// written, and lines that are not a message read as Invalid.
#include "wire.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ddprun {
namespace {

void expect_same(const Event& a, const Event& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.attempt, b.attempt);
  EXPECT_EQ(a.code, b.code);
  EXPECT_EQ(a.why, b.why);
}

void expect_same(const Decision& a, const Decision& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.attempt, b.attempt);
  EXPECT_EQ(a.code, b.code);
  EXPECT_EQ(a.node, b.node);
  EXPECT_EQ(a.run_id, b.run_id);
  EXPECT_EQ(a.why, b.why);
  if (a.kind == Decision::Start || a.kind == Decision::Restart) {
    EXPECT_EQ(a.restarts, b.restarts);
    EXPECT_EQ(a.members, b.members);
  }
}

Decision decision(Decision::Kind kind, int attempt, int code, int node, const std::string& run_id,
                  const std::string& why) {
  Decision d;
  d.kind = kind;
  d.attempt = attempt;
  d.code = code;
  d.node = node;
  d.run_id = run_id;
  d.why = why;
  return d;
}

TEST(Wire, AgentLines) {
  EXPECT_EQ(encode(AgentMessage::introduce({1, 2, 4, "", 0})), "hello 1 2 4");
  EXPECT_EQ(encode(AgentMessage::introduce({1, 2, 4, "", 2})), "hello 1 2 4");
  EXPECT_EQ(encode(AgentMessage::introduce({-1, 2, 4, "100", 0})), "hello -1 2 4 100");
  EXPECT_EQ(encode(AgentMessage::introduce({-1, 3, 4, "100", 2})), "hello -1 2:3 4 100");
  EXPECT_EQ(encode(AgentMessage::report(Event::worker_failed(1, 0, 5, "rank 3 failed"))),
            "fail 0 5 rank 3 failed");
  EXPECT_EQ(encode(AgentMessage::report(Event::workers_finished(1, 2))), "finished 2");
  EXPECT_EQ(encode(AgentMessage::report(Event::workers_stopped(1, 1))), "stopped 1");
  EXPECT_EQ(encode(AgentMessage::report(Event::aborted(1, 130, "stopped by SIGINT on b"))),
            "abort 130 stopped by SIGINT on b");
  EXPECT_EQ(encode(AgentMessage::ping()), "ping");
}

TEST(Wire, Node0Lines) {
  EXPECT_EQ(encode(Node0Message::order(decision(Decision::Start, 0, 0, -1, "abc123", ""))),
            "go 0 0 abc123");
  Decision elastic_start = decision(Decision::Start, 3, 0, -1, "abc123", "");
  elastic_start.restarts = 1;
  elastic_start.members = {0, 2};
  EXPECT_EQ(encode(Node0Message::order(elastic_start)), "go 3 1 abc123 0,2");
  Decision failure_restart = decision(Decision::Restart, 2, 0, 1, "", "rank 3 failed");
  failure_restart.restarts = 2;
  EXPECT_EQ(encode(Node0Message::order(failure_restart)), "restart 2 1 2 rank 3 failed");
  EXPECT_EQ(encode(Node0Message::order(decision(Decision::Exit, 0, 5, 1, "", "rank 3 failed"))),
            "abort 5 1 rank 3 failed");
  EXPECT_EQ(encode(Node0Message::order(decision(Decision::Exit, 0, 0, -1, "", ""))), "done");
  EXPECT_EQ(encode(Node0Message::refuse("--node-rank 1 has already joined")),
            "error --node-rank 1 has already joined");
  EXPECT_EQ(encode(Node0Message::ping()), "ping");
}

TEST(Wire, WhatIsNeverSentEncodesEmpty) {
  EXPECT_EQ(encode(AgentMessage{}), "");
  EXPECT_EQ(encode(AgentMessage::report(Event::node_lost(1, "gone"))), "");
  EXPECT_EQ(encode(AgentMessage::report(Event::joined(1))), "");
  EXPECT_EQ(encode(Node0Message{}), "");
  EXPECT_EQ(encode(Node0Message::order(Decision{})), "");  // Wait
}

TEST(Wire, AgentMessagesRoundTrip) {
  const std::vector<Event> events = {
      Event::worker_failed(1, 0, 5, "rank 3 (pid 42 on b) failed with exit code 5"),
      Event::worker_failed(1, 3, 137, "  leading spaces and  double  spaces"),
      Event::workers_finished(1, 2),
      Event::workers_stopped(1, 1),
      Event::aborted(1, 143, "stopped by SIGTERM on b"),
      Event::aborted(1, -1, "negative codes read back too"),
  };
  for (const Event& e : events) {
    const std::string line = encode(AgentMessage::report(e));
    SCOPED_TRACE(line);
    const AgentMessage m = decode_agent_message(line);
    ASSERT_EQ(m.kind, AgentMessage::Report);
    expect_same(m.event, e);
  }
  const AgentMessage hello =
      decode_agent_message(encode(AgentMessage::introduce({3, 4, 8, "", 0})));
  ASSERT_EQ(hello.kind, AgentMessage::Hello);
  EXPECT_EQ(hello.hello.node, 3);
  EXPECT_EQ(hello.hello.nnodes, 4);
  EXPECT_EQ(hello.hello.nproc, 8);
  EXPECT_EQ(hello.hello.run_id, "");
  const AgentMessage asks =
      decode_agent_message(encode(AgentMessage::introduce({-1, 3, 2, "job42", 1})));
  ASSERT_EQ(asks.kind, AgentMessage::Hello);
  EXPECT_EQ(asks.hello.node, -1);
  EXPECT_EQ(asks.hello.run_id, "job42");
  EXPECT_EQ(asks.hello.min_nodes, 1);
  EXPECT_EQ(asks.hello.nnodes, 3);
  EXPECT_EQ(decode_agent_message(encode(AgentMessage::ping())).kind, AgentMessage::Ping);
}

TEST(Wire, Node0MessagesRoundTrip) {
  const std::vector<Decision> decisions = {
      decision(Decision::Start, 0, 0, -1, "abc123", ""),
      decision(Decision::Start, 7, 0, -1, "job42", ""),
      decision(Decision::Restart, 1, 0, 0, "",
               "rank 1 (pid 9 on a) failed with signal SIGSEGV (11)"),
      decision(Decision::Restart, 2, 0, 1, "", ""),
      decision(Decision::Exit, 0, 130, 1, "", "stopped by SIGINT on b"),
      decision(Decision::Exit, 0, 1, -1, "", ""),  // the hosts did not all join
      decision(Decision::Exit, 0, 0, -1, "", ""),  // done
  };
  std::vector<Decision> all = decisions;
  Decision elastic = decision(Decision::Start, 4, 0, -1, "job42", "");
  elastic.restarts = 2;
  elastic.members = {0, 3, 5};
  all.push_back(elastic);
  Decision admit = decision(Decision::Restart, 5, 0, -1, "", "node 6 joined; restarting");
  admit.restarts = 2;
  all.push_back(admit);
  for (const Decision& d : all) {
    const std::string line = encode(Node0Message::order(d));
    SCOPED_TRACE(line);
    const Node0Message m = decode_node0_message(line);
    ASSERT_EQ(m.kind, Node0Message::Order);
    expect_same(m.decision, d);
  }
  const Node0Message refusal = decode_node0_message(
      encode(Node0Message::refuse("node 0 has --nnodes 2 but this host has 3")));
  ASSERT_EQ(refusal.kind, Node0Message::Refusal);
  EXPECT_EQ(refusal.refusal, "node 0 has --nnodes 2 but this host has 3");
  EXPECT_EQ(decode_node0_message(encode(Node0Message::ping())).kind, Node0Message::Ping);
  const Node0Message welcome = decode_node0_message(encode(Node0Message::welcome(3)));
  ASSERT_EQ(welcome.kind, Node0Message::Welcome);
  EXPECT_EQ(welcome.node, 3);
}

// Note [A new coordinator]: the members' addresses before each start, and a member
// that comes back to a new coordinator.
TEST(Wire, TakeoverLines) {
  EXPECT_EQ(encode(Node0Message::peer_list({{0, "10.0.0.1"}, {2, "fd00::3"}})),
            "peers 0=10.0.0.1,2=fd00::3");
  EXPECT_EQ(encode(AgentMessage::rejoining({2, 5, "job42"})), "rejoin 2 5 job42");

  const Node0Message peers = decode_node0_message("peers 1=10.9.9.2,3=host-c.example");
  ASSERT_EQ(peers.kind, Node0Message::PeerList);
  EXPECT_EQ(peers.peers, (Peers{{1, "10.9.9.2"}, {3, "host-c.example"}}));
  const AgentMessage back = decode_agent_message(encode(AgentMessage::rejoining({3, 7, "r1"})));
  ASSERT_EQ(back.kind, AgentMessage::Rejoining);
  EXPECT_EQ(back.rejoin.node, 3);
  EXPECT_EQ(back.rejoin.attempt, 7);
  EXPECT_EQ(back.rejoin.run_id, "r1");

  for (const char* bad : {"peers", "peers 1=", "peers =10.0.0.1", "peers 1:10.0.0.1", "peers 1=a,",
                          "peers x=a", "peers 1=a 2=b"})
    EXPECT_EQ(decode_node0_message(bad).kind, Node0Message::Invalid) << bad;
  for (const char* bad :
       {"rejoin", "rejoin 1 2", "rejoin x 2 id", "rejoin 1 y id", "rejoin 1 2 id more"})
    EXPECT_EQ(decode_agent_message(bad).kind, AgentMessage::Invalid) << bad;
}

TEST(Wire, MissingTextReadsAsBefore) {
  // An empty <what> leaves no word behind the numbers.
  EXPECT_EQ(decode_agent_message("fail 0 3").event.why, "failed");
  EXPECT_EQ(decode_agent_message("fail 0 3 ").event.why, "failed");
  EXPECT_EQ(decode_agent_message("abort 130").event.why, "stopped");
  const Node0Message m = decode_node0_message("abort 1 -1 ");
  ASSERT_EQ(m.kind, Node0Message::Order);
  EXPECT_EQ(m.decision.code, 1);
  EXPECT_EQ(m.decision.node, -1);
  EXPECT_EQ(m.decision.why, "");
  EXPECT_EQ(decode_node0_message("error").kind, Node0Message::Refusal);
  EXPECT_EQ(decode_node0_message("error").refusal, "");
}

TEST(Wire, EmptyLineIsAHeartbeat) {
  EXPECT_EQ(decode_agent_message("").kind, AgentMessage::Ping);
  EXPECT_EQ(decode_node0_message("").kind, Node0Message::Ping);
}

class MalformedAgentLine : public testing::TestWithParam<const char*> {};

TEST_P(MalformedAgentLine, IsInvalid) {
  EXPECT_EQ(decode_agent_message(GetParam()).kind, AgentMessage::Invalid)
      << "'" << GetParam() << "'";
}

INSTANTIATE_TEST_SUITE_P(Lines, MalformedAgentLine,
                         testing::Values("hello", "hello 1 2", "hello 1 2 3 4 5", "hello -1 2: 3",
                                         "hello -1 :2 3", "hello a 2 3", "hello 1 2 3x",
                                         "hello 99999999999 2 3", "hello +1 2 3", "fail", "fail 0",
                                         "fail x 3 why", "fail 0 3.5 why", "finished",
                                         "finished 1 2", "finished 1x", "stopped", "stopped -",
                                         "stopped --1", "abort", "abort x why", "ping now", "PING",
                                         "go 0 abc", "done", "restart 1 0 why", "bogus words"));

class MalformedNode0Line : public testing::TestWithParam<const char*> {};

TEST_P(MalformedNode0Line, IsInvalid) {
  EXPECT_EQ(decode_node0_message(GetParam()).kind, Node0Message::Invalid)
      << "'" << GetParam() << "'";
}

INSTANTIATE_TEST_SUITE_P(Lines, MalformedNode0Line,
                         testing::Values("go", "go 0", "go x abc", "go 0 abc", "go 0 abc extra",
                                         "go 0 x abc", "go 0 0 abc 1,x", "go 0 0 abc 1 2",
                                         "restart", "restart 1", "restart 1 0 why",
                                         "restart x 0 0 why", "restart 1 y 0 why",
                                         "restart 1 0 z why", "abort", "abort 1", "abort x 0 why",
                                         "abort 1 0x why", "done now", "fail 0 3 why",
                                         "hello 1 2 3", "stopped 1", "ping now", "2", "welcome",
                                         "welcome x", "welcome 1 2"));

TEST(Wire, SplitWords) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split_words("", 4), V{});
  EXPECT_EQ(split_words("a b", 4), (V{"a", "b"}));
  EXPECT_EQ(split_words("a  b   c", 4), (V{"a", "b", "c"}));
  EXPECT_EQ(split_words("a b c d e", 3), (V{"a", "b", "c d e"}));
  EXPECT_EQ(split_words("a b  c d", 3), (V{"a", "b", " c d"}));  // the rest as it is
  EXPECT_EQ(split_words("a b ", 3), (V{"a", "b"}));
}

}  // namespace
}  // namespace ddprun
