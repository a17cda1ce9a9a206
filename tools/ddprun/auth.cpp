#include "auth.h"

#include <cstring>

namespace ddprun::auth {
namespace {

const char kProofLabel[] = "ddprun-auth-v1 proof";
const char kSessionLabel[] = "ddprun-auth-v1 session";
const char kLineLabel[] = "ddprun-auth-v1 line";
const char kHelloWord[] = "auth-hello ";
const char kProofWord[] = "auth-proof ";

std::string bytes_text(const Bytes& b) { return std::string(b.begin(), b.end()); }

bool starts_with(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

// The 64 hex digits after `word` in `line` (nothing else), as bytes.
bool hex_after(const std::string& line, const char* word, size_t bytes, Bytes& out) {
  const size_t skip = std::strlen(word);
  if (!starts_with(line, word) || line.size() != skip + 2 * bytes) return false;
  return from_hex(line.substr(skip), out) && out.size() == bytes;
}

}  // namespace

const char* role_name(Role role) { return role == Role::Coordinator ? "coordinator" : "agent"; }

Bytes handshake_proof(const Bytes& secret, Role role, const Bytes& own, const Bytes& peer) {
  std::string data(kProofLabel, sizeof(kProofLabel));  // with its NUL
  data += role_name(role);
  data += '\0';
  data += bytes_text(own) + bytes_text(peer);
  return hmac_sha256(secret, data);
}

Channel::Channel(Bytes session_key, Role self) : key_(std::move(session_key)), self_(self) {}

Bytes Channel::mac(bool from_agent, uint64_t seq, const std::string& line) const {
  std::string data(kLineLabel, sizeof(kLineLabel));
  data += from_agent ? "agent->coordinator" : "coordinator->agent";
  data += '\0';
  for (int shift = 56; shift >= 0; shift -= 8) data += static_cast<char>((seq >> shift) & 0xff);
  data += line;
  return hmac_sha256(key_, data);
}

std::string Channel::seal(const std::string& line) {
  const uint64_t seq = sent_++;
  return std::to_string(seq) + " " + to_hex(mac(self_ == Role::Agent, seq, line)) + " " + line;
}

bool Channel::open(const std::string& wire, std::string& line, std::string& error) {
  const size_t space = wire.find(' ');
  const size_t mac_end = space + 1 + 2 * kMacBytes;
  Bytes got;
  bool digits = space != std::string::npos && space > 0 && space <= 20;
  for (size_t i = 0; digits && i < space; ++i) digits = wire[i] >= '0' && wire[i] <= '9';
  errno = 0;
  const unsigned long long claimed = digits ? std::strtoull(wire.c_str(), nullptr, 10) : 0;
  if (!digits || errno != 0 || wire.size() <= mac_end || wire[mac_end] != ' ' ||
      !from_hex(wire.substr(space + 1, 2 * kMacBytes), got)) {
    error =
        "not a signed line (after the handshake every line must read '<seq> <mac> <message>'): '" +
        printable(wire) + "'";
    return false;
  }
  const std::string message = wire.substr(mac_end + 1);
  const bool from_agent = self_ == Role::Coordinator;
  const uint64_t next = received_;
  if (claimed == next && same_mac(got, mac(from_agent, next, message))) {
    ++received_;
    line = message;
    return true;
  }
  const std::string numbers =
      "sequence number " + std::to_string(claimed) + " where " + std::to_string(next) + " is next";
  if (claimed != next && same_mac(got, mac(from_agent, claimed, message)))
    error = "a replayed or reordered line (" + numbers + ")";
  else if (claimed != next && same_mac(got, mac(from_agent, next, message)))
    error = "its sequence number was changed (" + numbers + ")";
  else
    error = "its MAC does not match: a forged or altered line, or one signed for another "
            "connection (" +
            (claimed == next ? "line " + std::to_string(next) : numbers) + ")";
  return false;
}

// --- Handshake --------------------------------------------------------------

Handshake::Handshake(Bytes secret, Role self)
    : Handshake(std::move(secret), self, random_bytes(kNonceBytes)) {}

Handshake::Handshake(Bytes secret, Role self, Bytes nonce)
    : secret_(std::move(secret)), self_(self), nonce_(std::move(nonce)) {}

std::string Handshake::hello() const { return kHelloWord + to_hex(nonce_); }

Handshake::Step Handshake::take(const std::string& line, std::string& reply, std::string& error) {
  reply.clear();
  const Role peer = self_ == Role::Agent ? Role::Coordinator : Role::Agent;
  switch (state_) {
    case State::Done:
      return Step::Done;
    case State::Failed:
      error = "the handshake already failed";
      return Step::Failed;
    case State::AwaitHello: {
      Bytes nonce;
      if (!starts_with(line, "auth-")) {
        peer_is_plain_ = true;
        error = "it sent '" + printable(line) +
                "' instead of the authentication handshake (a host without "
                "--rdzv-secret-file, or not a ddprun at all)";
      } else if (!hex_after(line, kHelloWord, kNonceBytes, nonce)) {
        error = "expected 'auth-hello <nonce>' to begin the handshake, but it sent '" +
                printable(line) + "'";
      } else if (same_mac(nonce, nonce_)) {
        error = "it sent back this end's own nonce (a reflected handshake)";
      } else {
        peer_nonce_ = std::move(nonce);
        reply = kProofWord + to_hex(handshake_proof(secret_, self_, nonce_, peer_nonce_));
        state_ = State::AwaitProof;
        return Step::Continue;
      }
      state_ = State::Failed;
      return Step::Failed;
    }
    case State::AwaitProof: {
      Bytes proof;
      state_ = State::Failed;
      if (!hex_after(line, kProofWord, kMacBytes, proof)) {
        error =
            "expected 'auth-proof <mac>' after its nonce, but it sent '" + printable(line) + "'";
        return Step::Failed;
      }
      if (same_mac(proof, handshake_proof(secret_, peer, peer_nonce_, nonce_))) {
        state_ = State::Done;
        return Step::Done;
      }
      if (same_mac(proof, handshake_proof(secret_, self_, nonce_, peer_nonce_)))
        error = "it sent back this end's own proof (a reflected handshake)";
      else
        error = "its proof of the job secret does not match: it holds another secret (the "
                "hosts' --rdzv-secret-file differ) or none";
      return Step::Failed;
    }
  }
  return Step::Failed;
}

Channel Handshake::channel() const {
  const Bytes& agent = self_ == Role::Agent ? nonce_ : peer_nonce_;
  const Bytes& coordinator = self_ == Role::Agent ? peer_nonce_ : nonce_;
  std::string data(kSessionLabel, sizeof(kSessionLabel));
  data += bytes_text(agent) + bytes_text(coordinator);
  return Channel(hmac_sha256(secret_, data), self_);
}

}  // namespace ddprun::auth
