// Authentication of the control channel (docs/security.md). Every host of a job holds
// the same secret (--rdzv-secret-file); each connection starts with a challenge-response
// handshake that proves, both ways, that the other end holds it, and every line after
// that carries an HMAC over its direction, its sequence number and its text.
// OpenSSL's libcrypto does all the cryptography (HMAC-SHA256, RAND_bytes,
// CRYPTO_memcmp, through src/secret/job_secret.h, which also reads and writes the secret
// file); this file only arranges what is signed. There is no I/O here:
// control_channel.cpp sends and receives the lines.
//
// Note [Signed lines]
// Handshake, one plain line each way per step (the nonces are 32 bytes from RAND_bytes):
//
//   both ends, at once:        auth-hello <64 hex: its nonce>
//   each, on the other's hello: auth-proof <64 hex: HMAC-SHA256(secret,
//                                 "ddprun-auth-v1 proof" 0x00 ROLE 0x00 own nonce || peer nonce)>
//
// ROLE is "coordinator" for the end that accepted the connection (node 0, or the host
// that took over) and "agent" for the end that connected, so a proof reflected back to
// its sender never verifies; a nonce equal to one's own is refused too. Each end checks
// the other's proof (CRYPTO_memcmp) before it reads anything else from it. Both then
// derive the connection's key
//
//   session = HMAC-SHA256(secret, "ddprun-auth-v1 session" 0x00 agent nonce || coordinator nonce)
//
// and every line after the handshake, both ways, is sent as
//
//   <seq> <64 hex: HMAC-SHA256(session, "ddprun-auth-v1 line" 0x00 DIRECTION 0x00
//                                        seq as 8 bytes big-endian || line)> <line>
//
// with DIRECTION "agent->coordinator" or "coordinator->agent" and seq counting the lines
// sent that way on this connection, from 0. The receiver takes only the exact next seq
// with a matching HMAC: a forged, altered, replayed, reordered or dropped-then-resent
// line is refused, and so is a line of another connection (another session key).
#pragma once

#include "secret/job_secret.h"  // the secret file and the primitives (src/secret)

#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::auth {

using ddp::secret::Bytes;
using ddp::secret::from_hex;
using ddp::secret::hmac_sha256;
using ddp::secret::kMacBytes;
using ddp::secret::kMaxSecretBytes;
using ddp::secret::kMinSecretBytes;
using ddp::secret::load_secret_file;
using ddp::secret::make_secret_file;
using ddp::secret::printable;
using ddp::secret::random_bytes;
using ddp::secret::same_mac;
using ddp::secret::to_hex;

constexpr size_t kNonceBytes = 32;
// The longest handshake line (auth-proof and 64 hex digits, with room to spare): a peer
// that sends more before it has authenticated is cut off.
constexpr size_t kMaxHandshakeLine = 160;
// What a signed line adds to the message: the sequence number, the MAC, two spaces.
constexpr size_t kSealOverhead = 20 + 1 + 2 * kMacBytes + 1;

// Which end of a connection: the coordinator accepted it, the agent connected.
enum class Role { Coordinator, Agent };
const char* role_name(Role role);

// The proof an end with role `role` and nonce `own` gives to the end with nonce `peer`.
Bytes handshake_proof(const Bytes& secret, Role role, const Bytes& own, const Bytes& peer);

// The lines of one authenticated connection, one end of it (Note [Signed lines]).
class Channel {
 public:
  Channel(Bytes session_key, Role self);

  // The line as sent: "<seq> <mac> <line>"; counts it.
  std::string seal(const std::string& line);
  // The message of a received signed line into `line`, if it is the next one and its
  // MAC matches; else false with `error` saying what was wrong with it.
  bool open(const std::string& wire, std::string& line, std::string& error);

  uint64_t sent() const { return sent_; }
  uint64_t received() const { return received_; }

 private:
  Bytes mac(bool from_agent, uint64_t seq, const std::string& line) const;

  Bytes key_;
  Role self_;
  uint64_t sent_ = 0;
  uint64_t received_ = 0;
};

// One end's side of the handshake of a connection (Note [Signed lines]):
//
//   Handshake h(secret, Role::Agent);
//   send(h.hello());
//   for each line received until h.done():
//     switch (h.take(line, reply, error)) { ... send(reply) when not empty ... }
//   Channel c = h.channel();
class Handshake {
 public:
  enum class Step { Continue, Done, Failed };

  Handshake(Bytes secret, Role self);               // a fresh nonce from RAND_bytes
  Handshake(Bytes secret, Role self, Bytes nonce);  // a given nonce (tests)

  std::string hello() const;  // "auth-hello <nonce>"
  // Takes the peer's next line. Continue: `reply` (when not empty) is to be sent, and
  // more is awaited; Done: the peer proved that it holds the secret; Failed: `error`
  // says why (the connection must be closed). Once Failed or Done, stays so.
  Step take(const std::string& line, std::string& reply, std::string& error);
  bool done() const { return state_ == State::Done; }
  // Whether the peer's first line was not a handshake line at all (a host without
  // --rdzv-secret-file, which speaks the plain protocol).
  bool peer_is_plain() const { return peer_is_plain_; }
  // The connection's signed lines; only once done().
  Channel channel() const;

  const Bytes& nonce() const { return nonce_; }

 private:
  enum class State { AwaitHello, AwaitProof, Done, Failed };

  Bytes secret_;
  Role self_;
  Bytes nonce_;
  Bytes peer_nonce_;
  State state_ = State::AwaitHello;
  bool peer_is_plain_ = false;
};

}  // namespace ddprun::auth
