#include "wire.h"

#include <charconv>

namespace ddprun {
namespace {

// A whole word as a decimal int (an optional '-', digits, in range).
bool read_int(const std::string& word, int& value) {
  const char* end = word.data() + word.size();
  auto [ptr, ec] = std::from_chars(word.data(), end, value);
  return ec == std::errc() && ptr == end && !word.empty();
}

// The optional free text that ends a message: the word at `index`, if any.
std::string text_at(const std::vector<std::string>& words, size_t index, const char* fallback) {
  return words.size() > index ? words[index] : fallback;
}

}  // namespace

AgentMessage AgentMessage::ping() {
  AgentMessage m;
  m.kind = Ping;
  return m;
}

AgentMessage AgentMessage::introduce(const Introduction& hello) {
  AgentMessage m;
  m.kind = Hello;
  m.hello = hello;
  return m;
}

AgentMessage AgentMessage::report(const Event& e) {
  AgentMessage m;
  m.kind = Report;
  m.event = e;
  return m;
}

AgentMessage AgentMessage::rejoining(const Rejoin& r) {
  AgentMessage m;
  m.kind = Rejoining;
  m.rejoin = r;
  return m;
}

Node0Message Node0Message::peer_list(const Peers& peers) {
  Node0Message m;
  m.kind = PeerList;
  m.peers = peers;
  return m;
}

Node0Message Node0Message::ping() {
  Node0Message m;
  m.kind = Ping;
  return m;
}

Node0Message Node0Message::welcome(int node) {
  Node0Message m;
  m.kind = Welcome;
  m.node = node;
  return m;
}

Node0Message Node0Message::order(const Decision& d) {
  Node0Message m;
  m.kind = Order;
  m.decision = d;
  return m;
}

Node0Message Node0Message::refuse(const std::string& problem) {
  Node0Message m;
  m.kind = Refusal;
  m.refusal = problem;
  return m;
}

std::string encode(const AgentMessage& m) {
  using std::to_string;
  const Event& e = m.event;
  switch (m.kind) {
    case AgentMessage::Invalid:
      return "";
    case AgentMessage::Ping:
      return "ping";
    case AgentMessage::Rejoining:
      return "rejoin " + to_string(m.rejoin.node) + " " + to_string(m.rejoin.attempt) + " " +
             m.rejoin.run_id;
    case AgentMessage::Hello:
      return "hello " + to_string(m.hello.node) + " " +
             (m.hello.min_nodes > 0 && m.hello.min_nodes < m.hello.nnodes
                  ? to_string(m.hello.min_nodes) + ":" + to_string(m.hello.nnodes)
                  : to_string(m.hello.nnodes)) +
             " " + to_string(m.hello.nproc) + (m.hello.run_id.empty() ? "" : " " + m.hello.run_id);
    case AgentMessage::Report:
      switch (e.kind) {
        case Event::WorkerFailed:
          return "fail " + to_string(e.attempt) + " " + to_string(e.code) + " " + e.why;
        case Event::WorkersFinished:
          return "finished " + to_string(e.attempt);
        case Event::WorkersStopped:
          return "stopped " + to_string(e.attempt);
        case Event::Aborted:
          return "abort " + to_string(e.code) + " " + e.why;
        case Event::NodeJoined:
        case Event::JoinTimedOut:
        case Event::NodeLost:
        case Event::LastCallOver:
          return "";  // node 0 sees these itself
      }
  }
  return "";
}

AgentMessage decode_agent_message(const std::string& line) {
  const auto w = split_words(line, 4);
  AgentMessage m;
  if (w.empty() || (w[0] == "ping" && w.size() == 1)) return AgentMessage::ping();
  Introduction h;
  int attempt = 0, code = 0;
  if (w[0] == "hello" && w.size() == 4) {
    const auto hw = split_words(line, 6);  // the run id is one word; more is not a hello
    // (The first split's last word may be only spaces, which this one drops.)
    if (hw.size() < 4) return m;
    if (hw.size() == 5) h.run_id = hw[4];
    const size_t colon = hw[2].find(':');
    const bool nnodes_ok = colon == std::string::npos
                               ? read_int(hw[2], h.nnodes)
                               : read_int(hw[2].substr(0, colon), h.min_nodes) &&
                                     read_int(hw[2].substr(colon + 1), h.nnodes);
    if (hw.size() <= 5 && read_int(hw[1], h.node) && nnodes_ok && read_int(hw[3], h.nproc))
      m = AgentMessage::introduce(h);
  } else if (w[0] == "rejoin" && w.size() == 4) {
    Rejoin r;
    r.run_id = w[3];
    if (r.run_id.find(' ') == std::string::npos && read_int(w[1], r.node) &&
        read_int(w[2], r.attempt))
      m = AgentMessage::rejoining(r);
  } else if (w[0] == "fail" && w.size() >= 3) {
    if (read_int(w[1], attempt) && read_int(w[2], code))
      m = AgentMessage::report(Event::worker_failed(-1, attempt, code, text_at(w, 3, "failed")));
  } else if (w[0] == "finished" && w.size() == 2) {
    if (read_int(w[1], attempt)) m = AgentMessage::report(Event::workers_finished(-1, attempt));
  } else if (w[0] == "stopped" && w.size() == 2) {
    if (read_int(w[1], attempt)) m = AgentMessage::report(Event::workers_stopped(-1, attempt));
  } else if (w[0] == "abort" && w.size() >= 2) {
    const auto a = split_words(line, 3);  // <what> starts one word earlier here
    if (a.size() >= 2 && read_int(a[1], code))
      m = AgentMessage::report(Event::aborted(-1, code, text_at(a, 2, "stopped")));
  }
  return m;
}

std::string encode(const Node0Message& m) {
  using std::to_string;
  const Decision& d = m.decision;
  switch (m.kind) {
    case Node0Message::Invalid:
      return "";
    case Node0Message::Ping:
      return "ping";
    case Node0Message::Refusal:
      return "error " + m.refusal;
    case Node0Message::Welcome:
      return "welcome " + to_string(m.node);
    case Node0Message::PeerList: {
      std::string line = "peers";
      for (size_t i = 0; i < m.peers.size(); ++i)
        line += (i ? "," : " ") + to_string(m.peers[i].first) + "=" + m.peers[i].second;
      return line;
    }
    case Node0Message::Order:
      switch (d.kind) {
        case Decision::Start: {
          std::string line =
              "go " + to_string(d.attempt) + " " + to_string(d.restarts) + " " + d.run_id;
          for (size_t i = 0; i < d.members.size(); ++i)
            line += (i ? "," : " ") + to_string(d.members[i]);
          return line;
        }
        case Decision::Restart:
          return "restart " + to_string(d.attempt) + " " + to_string(d.node) + " " +
                 to_string(d.restarts) + " " + d.why;
        case Decision::Exit:
          if (d.code == 0) return "done";
          return "abort " + to_string(d.code) + " " + to_string(d.node) + " " + d.why;
        case Decision::Wait:
        case Decision::LastCall:  // node 0's own timer
          return "";
      }
  }
  return "";
}

Node0Message decode_node0_message(const std::string& line) {
  const auto w = split_words(line, 4);
  Node0Message m;
  if (w.empty() || (w[0] == "ping" && w.size() == 1)) return Node0Message::ping();
  Decision d;
  if (w[0] == "go" && w.size() == 4) {
    const auto g = split_words(line, 6);  // the members list is one word; more is not a go
    if (g.size() < 4) return m;           // (a last word of spaces only, dropped here)
    d.kind = Decision::Start;
    d.run_id = g[3];
    bool ok = g.size() <= 5 && read_int(g[1], d.attempt) && read_int(g[2], d.restarts);
    if (ok && g.size() == 5) {
      size_t pos = 0;
      while (ok && pos <= g[4].size()) {
        size_t end = g[4].find(',', pos);
        if (end == std::string::npos) end = g[4].size();
        int node = 0;
        ok = read_int(g[4].substr(pos, end - pos), node);
        d.members.push_back(node);
        pos = end + 1;
      }
    }
    if (ok) m = Node0Message::order(d);
  } else if (w[0] == "peers" && w.size() == 2) {
    Peers peers;
    bool ok = true;
    for (size_t pos = 0; ok && pos <= w[1].size();) {
      size_t end = w[1].find(',', pos);
      if (end == std::string::npos) end = w[1].size();
      const std::string item = w[1].substr(pos, end - pos);
      const size_t eq = item.find('=');
      int node = 0;
      ok = eq != std::string::npos && eq + 1 < item.size() && read_int(item.substr(0, eq), node);
      if (ok) peers.emplace_back(node, item.substr(eq + 1));
      pos = end + 1;
    }
    if (ok) m = Node0Message::peer_list(peers);
  } else if (w[0] == "welcome" && w.size() == 2) {
    int node = -1;
    if (read_int(w[1], node)) m = Node0Message::welcome(node);
  } else if (w[0] == "restart" && w.size() >= 4) {
    const auto r = split_words(line, 5);  // <why> starts one word later here
    if (r.size() < 4) return m;           // (a last word of spaces only, dropped here)
    d.kind = Decision::Restart;
    d.why = text_at(r, 4, "");
    if (read_int(r[1], d.attempt) && read_int(r[2], d.node) && read_int(r[3], d.restarts))
      m = Node0Message::order(d);
  } else if (w[0] == "done" && w.size() == 1) {
    d.kind = Decision::Exit;
    m = Node0Message::order(d);
  } else if (w[0] == "abort" && w.size() >= 3) {
    d.kind = Decision::Exit;
    d.why = text_at(w, 3, "");
    if (read_int(w[1], d.code) && read_int(w[2], d.node)) m = Node0Message::order(d);
  } else if (w[0] == "error") {
    m = Node0Message::refuse(text_at(split_words(line, 2), 1, ""));
  }
  return m;
}

std::vector<std::string> split_words(const std::string& line, size_t max_words) {
  std::vector<std::string> words;
  size_t pos = 0;
  while (pos < line.size() && words.size() + 1 < max_words) {
    size_t end = line.find(' ', pos);
    if (end == std::string::npos) end = line.size();
    if (end > pos) words.push_back(line.substr(pos, end - pos));
    pos = end + 1;
  }
  if (pos < line.size()) words.push_back(line.substr(pos));
  return words;
}

}  // namespace ddprun
