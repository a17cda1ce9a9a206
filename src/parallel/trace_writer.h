#pragma once

// Writes Chrome trace-event JSON ("JSON Array Format") for one rank. Events are kept in
// memory until flush(), which appends them and rewrites the closing bracket, so the
// file on disk is complete, valid JSON after every flush (DDP flushes at the end of
// each backward) and a crashed run still leaves a readable timeline.
//
// Tracks (Chrome "threads") of a rank's process (pid = rank):
//   kMainTrack     forward, backward, the wait at the end of backward
//   kUserTrack     user scopes (ddp::trace::Scope), e.g. optimizer.step
//   kBucketTrack+b bucket b's all-reduce, launch -> done

#include "distributed/common/json_quote.h"
#include "parallel/clock.h"

#include <cstdint>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

namespace ddp {
namespace detail {

constexpr int kMainTrack = 1;
constexpr int kUserTrack = 2;
constexpr int kBucketTrack = 100;

/// "{rank}" in `path` replaced by the rank, else ".rank<r>" before a ".json" ending,
/// else appended.
std::string trace_file_for_rank(const std::string& path, int rank);

class TraceWriter {
 public:
  /// Opens (truncates) the file; throws naming the path if it cannot.
  TraceWriter(const std::string& path, int rank);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  const std::string& path() const { return path_; }

  /// A complete ('X') event. `args_json` is a JSON object body without braces
  /// (e.g. "\"bytes\":1024") or empty.
  void complete(const std::string& name, int track, int64_t start_us, int64_t dur_us,
                const std::string& args_json = "");
  /// Names a track, once per track.
  void name_track(int track, const std::string& name);
  /// Appends pending events to the file and leaves it valid JSON.
  void flush();

 private:
  void add(std::string event);

  std::mutex mutex_;
  std::string path_;
  int rank_;
  std::ofstream file_;
  std::vector<std::string> pending_;
  std::vector<int> named_tracks_;
  bool first_event_ = true;
  std::streampos end_of_events_ = 0;
};

}  // namespace detail
}  // namespace ddp
