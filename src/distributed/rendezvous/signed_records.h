// Note [Signed store records] (signed_records.cpp): the store's values signed with a key
// derived from the job secret, so that a process without it cannot forge them.
#pragma once

#include <memory>
#include <optional>
#include <string>

namespace ddp {
namespace detail {

class RecordSigner {
 public:
  /// The signer of one attempt of one job: its key is derived from the job secret, the
  /// run id and the attempt (TORCHELASTIC_RESTART_COUNT), so a record of another job or
  /// attempt does not verify.
  static std::shared_ptr<const RecordSigner> for_attempt(const std::string& secret,
                                                         const std::string& run_id, int attempt);

  /// `value` with its signature appended: what goes into the store under `key` (the
  /// key's full name, prefixes included).
  std::string seal(const std::string& key, const std::string& value) const;
  /// The value of a record read from `key`, or nullopt when the record does not carry a
  /// valid signature for that key (written without this job's secret, for another key,
  /// another job or another attempt, or cut short).
  std::optional<std::string> open(const std::string& key, const std::string& record) const;

  static constexpr size_t kSignatureBytes = 32;

 private:
  explicit RecordSigner(std::string key) : key_(std::move(key)) {}
  std::string mac(const std::string& key, const std::string& value) const;
  std::string key_;
};

/// The signer that DDP_SECRET_FILE asks for, or null when it is unset. The file is read
/// and checked as ddprun's --rdzv-secret-file is (64+ hex digits, mode 0600); a bad one
/// is refused with the reason, naming `rank`.
std::shared_ptr<const RecordSigner> signer_from_environment(int rank);

}  // namespace detail
}  // namespace ddp
