// Note [Signed store records]
// Rank 0's TCPStore has no authentication: anyone who reaches MASTER_PORT can write any
// key (docs/security.md). What the ranks read from it decides who they talk to: the host
// identities (ddp/arrived/<rank>) choose shared memory, placement and interfaces, and
// Gloo's own records give each pair's address, so a stranger's record there would route
// a rank's tensors to the stranger. With a job secret (DDP_SECRET_FILE, which ddprun sets
// from --rdzv-secret-file), every value set in the store is signed and every value read
// is checked:
//
//   key_attempt = HMAC-SHA256(secret, "ddp-cpp store v1" 0x00 run_id 0x00 attempt)
//   record      = value || HMAC-SHA256(key_attempt, "ddp-cpp record v1" 0x00 key 0x00 value)
//
// `key` is the full name, PrefixStore's prefixes included, so a record copied to another
// key fails; a record of another job or attempt fails too (another key_attempt). The
// check compares in constant time (CRYPTO_memcmp). A read that finds a record that does
// not verify treats it as not there yet: it says so once on stderr and keeps waiting,
// within the store's timeout, for a signed value to replace it (the rank that owns the
// key writes it with set(), which overwrites). A forged record written before the real
// one therefore costs nothing; one written after it stalls the readers until their
// timeout, whose error names the key. That is the denial of service a stranger who
// reaches the port keeps (deleting keys does the same); joining or redirecting is gone.
//
// What is not signed: add() counters (the server adds; c10d's barriers and the library's
// arrival counts), wait() and check() (existence only), and deleteKey(). A counter that a
// stranger bumps can end a wait early; every such wait is followed by reading signed
// records, which then wait for the real ones.
#include "distributed/rendezvous/signed_records.h"

#include "distributed/rendezvous/rendezvous.h"
#include "secret/job_secret.h"

#include <ddp/errors.h>

namespace ddp {
namespace detail {
namespace {

secret::Bytes bytes_of(const std::string& s) { return secret::Bytes(s.begin(), s.end()); }

}  // namespace

std::shared_ptr<const RecordSigner> RecordSigner::for_attempt(const std::string& secret,
                                                              const std::string& run_id,
                                                              int attempt) {
  std::string label("ddp-cpp store v1");
  label += '\0';
  label += run_id;
  label += '\0';
  label += std::to_string(attempt);
  const secret::Bytes key = secret::hmac_sha256(bytes_of(secret), label);
  return std::shared_ptr<const RecordSigner>(new RecordSigner(std::string(key.begin(), key.end())));
}

std::string RecordSigner::mac(const std::string& key, const std::string& value) const {
  std::string data("ddp-cpp record v1");
  data += '\0';
  data += key;
  data += '\0';
  data += value;
  const secret::Bytes m = secret::hmac_sha256(bytes_of(key_), data);
  return std::string(m.begin(), m.end());
}

std::string RecordSigner::seal(const std::string& key, const std::string& value) const {
  return value + mac(key, value);
}

std::optional<std::string> RecordSigner::open(const std::string& key,
                                              const std::string& record) const {
  if (record.size() < kSignatureBytes) return std::nullopt;
  std::string value = record.substr(0, record.size() - kSignatureBytes);
  const secret::Bytes got = bytes_of(record.substr(record.size() - kSignatureBytes));
  if (!secret::same_mac(got, bytes_of(mac(key, value)))) return std::nullopt;
  return value;
}

std::shared_ptr<const RecordSigner> signer_from_environment(int rank) {
  const auto path = env_string("DDP_SECRET_FILE");
  if (!path) return nullptr;
  secret::Bytes secret;
  std::string error;
  if (!secret::load_secret_file(*path, secret, error, "DDP_SECRET_FILE")) {
    throw ProcessGroupError("rank " + std::to_string(rank) + ": " + error);
  }
  // ddprun sets both; a launcher that sets neither gets one key for every attempt.
  const std::string run_id =
      env_string("DDP_RUN_ID").value_or(env_string("TORCHELASTIC_RUN_ID").value_or(""));
  const int attempt = env_int("TORCHELASTIC_RESTART_COUNT").value_or(0);
  return RecordSigner::for_attempt(std::string(secret.begin(), secret.end()), run_id, attempt);
}

}  // namespace detail
}  // namespace ddp
