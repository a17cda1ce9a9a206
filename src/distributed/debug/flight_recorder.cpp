#include "distributed/debug/flight_recorder.h"

#include "distributed/debug/device_event.h"
#include "distributed/common/json_quote.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <unistd.h>

namespace ddp {
namespace detail {
namespace {

int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* state_name(int s) {
  switch (s) {
    case 0:
      return "started";
    case 1:
      return "completed";
    default:
      return "failed";
  }
}

}  // namespace

FlightRecorder::FlightRecorder(size_t capacity, int rank, int world_size, std::string backend,
                               std::string dir)
    : capacity_(capacity),
      rank_(rank),
      world_size_(world_size),
      backend_(std::move(backend)),
      dir_(std::move(dir)),
      ring_(capacity) {}

FlightRecorder::Entry* FlightRecorder::find(uint64_t seq) {
  Entry& e = ring_[seq % capacity_];
  return e.seq == seq ? &e : nullptr;
}

void FlightRecorder::start(uint64_t seq, const std::string& what) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = ring_[seq % capacity_];
  e.seq = seq;
  e.what = what;
  e.start_us = wall_us();
  e.end_us = 0;
  e.state = State::kStarted;
  e.error.clear();
  e.end.reset();
}

void FlightRecorder::complete(uint64_t seq) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(seq)) {
    if (e->state == State::kStarted) {
      e->state = State::kCompleted;
      e->end_us = wall_us();
    }
  }
}

void FlightRecorder::complete_on_device(uint64_t seq, std::shared_ptr<DeviceEvent> end) {
  if (!enabled()) return;
  if (!end) return complete(seq);
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(seq)) {
    if (e->state == State::kStarted) e->end = std::move(end);
  }
}

FlightRecorder::State FlightRecorder::current_state(const Entry& e) {
  if (e.state == State::kStarted && e.end && e.end->done()) return State::kCompleted;
  return e.state;
}

void FlightRecorder::fail(uint64_t seq, const std::string& error) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(seq)) {
    e->state = State::kFailed;
    e->end_us = wall_us();
    e->error = error.substr(0, 500);
  }
}

std::vector<FlightRecorder::Entry> FlightRecorder::ordered() const {
  std::vector<Entry> out;
  for (const Entry& e : ring_) {
    if (e.seq != 0) out.push_back(e);
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.seq < b.seq; });
  return out;
}

std::string FlightRecorder::recent(size_t n) const {
  if (!enabled()) return "";
  std::lock_guard<std::mutex> lock(mutex_);
  const std::vector<Entry> all = ordered();
  std::ostringstream os;
  const int64_t now = wall_us();
  for (size_t i = all.size() > n ? all.size() - n : 0; i < all.size(); ++i) {
    const Entry& e = all[i];
    const State state = current_state(e);
    os << "\n  #" << e.seq << " " << e.what << ": " << state_name(static_cast<int>(state));
    if (state == State::kStarted) {
      os << " " << (now - e.start_us) / 1000 << " ms ago, not finished";
    }
  }
  return os.str();
}

std::string FlightRecorder::dump(const std::string& reason) {
  if (!enabled() || dir_.empty()) return "";
  std::lock_guard<std::mutex> lock(mutex_);
  if (dumped_) return "";  // the first failure is the one worth keeping
  dumped_ = true;
  std::ostringstream doc;
  doc << "{\"rank\": " << rank_ << ", \"world_size\": " << world_size_
      << ", \"backend\": " << json_quote(backend_) << ", \"pid\": " << ::getpid()
      << ", \"reason\": " << json_quote(reason) << ", \"dumped_us\": " << wall_us()
      << ",\n \"entries\": [";
  const std::vector<Entry> entries = ordered();
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    doc << (i == 0 ? "\n  " : ",\n  ") << "{\"seq\": " << e.seq
        << ", \"what\": " << json_quote(e.what) << ", \"start_us\": " << e.start_us
        << ", \"end_us\": " << e.end_us << ", \"state\": \""
        << state_name(static_cast<int>(current_state(e))) << "\"";
    if (!e.error.empty()) doc << ", \"error\": " << json_quote(e.error);
    doc << "}";
  }
  doc << "\n]}\n";

  const std::string path = dir_ + "/flight_recorder.rank" + std::to_string(rank_) + ".json";
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return "";
    out << doc.str();
    if (!out.flush()) {
      std::remove(tmp.c_str());
      return "";
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return "";
  }
  return path;
}

}  // namespace detail
}  // namespace ddp
