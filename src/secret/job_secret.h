// The job secret and the primitives that use it: HMAC-SHA256, random bytes and a
// constant-time comparison, all OpenSSL's libcrypto (docs/security.md). Shared by ddprun's
// control channel (tools/ddprun/auth.h) and the library's signed store records (Note
// [Signed store records], src/distributed/backends/signed_store.cpp). No LibTorch here.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ddp::secret {

using Bytes = std::vector<unsigned char>;

constexpr size_t kMinSecretBytes = 32;
constexpr size_t kMaxSecretBytes = 1024;
constexpr size_t kMacBytes = 32;  // SHA-256

// HMAC-SHA256 of `data` under `key` (OpenSSL's HMAC()).
Bytes hmac_sha256(const Bytes& key, const std::string& data);
// Whether two MACs are equal, in time that does not depend on where they differ
// (CRYPTO_memcmp); false when their sizes differ.
bool same_mac(const Bytes& a, const Bytes& b);
// `n` bytes from OpenSSL's RAND_bytes; throws std::runtime_error when it fails.
Bytes random_bytes(size_t n);

std::string to_hex(const Bytes& bytes);  // lower case
// An even number of hex digits (either case) into bytes; false for anything else.
bool from_hex(const std::string& text, Bytes& out);

// Text received from a stranger, fit for a log line: at most `max` characters, anything
// not printable as '?'.
std::string printable(const std::string& text, size_t max = 60);

// The job secret in file `path`: 64 or more hex digits (32 or more bytes; whitespace
// around them is ignored), in a regular file that only its owner, this user (or root),
// can read and write (mode & 077 == 0). False with `error` saying what was expected,
// what was found, and what to do; `source` names where the path came from in it
// ("--rdzv-secret-file", "DDP_SECRET_FILE").
bool load_secret_file(const std::string& path, Bytes& secret, std::string& error,
                      const std::string& source = "--rdzv-secret-file");
// Writes a new secret (32 bytes from RAND_bytes, as 64 hex digits and a newline) to
// `path`, mode 0600, all at once: the file appears complete or not at all, and an
// existing file is never replaced. False with `error` set.
bool make_secret_file(const std::string& path, std::string& error);

}  // namespace ddp::secret
