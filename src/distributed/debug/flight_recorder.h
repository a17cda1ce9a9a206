#pragma once

// Note [Flight recorder]
// Each group keeps a ring of its last N collectives (DDP_FLIGHT_RECORDER_SIZE, 2000 by
// default, 0 turns it off): sequence number, op, tensors, root, wall-clock start and
// end, and state (started, completed, failed). When a collective of this rank fails or
// times out, or a fingerprint check fails, and otherwise when the group is shut down,
// the ring is written as JSON to <DDP_FLIGHT_RECORDER_DIR>/flight_recorder.rank<r>.json
// (ddprun sets the folder, removes it when the job succeeds, and names the files in
// its failure summary when it fails). tools/flight_recorder.py lines up all
// ranks' files and points at the first collective that not every rank entered.
// Recording costs a lock and a few stores per collective; the file is written only on
// failure, whole or not at all (written aside, then renamed).

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ddp {
namespace detail {

class DeviceEvent;

class FlightRecorder {
 public:
  FlightRecorder(size_t capacity, int rank, int world_size, std::string backend, std::string dir);

  bool enabled() const { return capacity_ > 0; }
  /// A collective starts: `what` is its fingerprint text ("all_reduce [float 1024]").
  void start(uint64_t seq, const std::string& what);
  void complete(uint64_t seq);
  /// Note [Device time]: a collective on a GPU is complete when `end` is done, which
  /// the recorder asks when it reports; until then it shows as started.
  void complete_on_device(uint64_t seq, std::shared_ptr<DeviceEvent> end);
  void fail(uint64_t seq, const std::string& error);

  /// The last `n` entries, one line each, oldest first (for error messages).
  std::string recent(size_t n) const;
  /// Writes the ring to the file (if a folder is set); returns its path or "".
  std::string dump(const std::string& reason);

 private:
  enum class State { kStarted, kCompleted, kFailed };
  struct Entry {
    uint64_t seq = 0;  // 0: empty
    std::string what;
    int64_t start_us = 0;
    int64_t end_us = 0;
    State state = State::kStarted;
    std::string error;
    std::shared_ptr<DeviceEvent> end;  // complete_on_device: done when this is
  };
  /// The entry's state as of now (a device entry whose event is done is completed).
  static State current_state(const Entry& e);
  Entry* find(uint64_t seq);
  std::vector<Entry> ordered() const;

  const size_t capacity_;
  const int rank_;
  const int world_size_;
  const std::string backend_;
  const std::string dir_;
  mutable std::mutex mutex_;
  std::vector<Entry> ring_;
  bool dumped_ = false;
};

}  // namespace detail
}  // namespace ddp
