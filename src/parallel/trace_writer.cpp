#include "parallel/trace_writer.h"
#include "distributed/common/check.h"

#include <ddp/parallel/distributed_data_parallel.h>
#include <ddp/parallel/trace.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>

namespace ddp {
namespace detail {

std::string trace_file_for_rank(const std::string& path, int rank) {
  const std::string r = std::to_string(rank);
  const std::string key = "{rank}";
  const auto pos = path.find(key);
  if (pos != std::string::npos) {
    std::string out = path;
    out.replace(pos, key.size(), r);
    return out;
  }
  const std::string ext = ".json";
  if (path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0) {
    return path.substr(0, path.size() - ext.size()) + ".rank" + r + ext;
  }
  return path + ".rank" + r;
}

TraceWriter::TraceWriter(const std::string& path, int rank)
    : path_(path), rank_(rank), file_(path, std::ios::out | std::ios::trunc) {
  DDP_CHECK(file_.good(), "DistributedDataParallel on rank ", rank,
            ": cannot open the trace file '", path,
            "' (from trace_path) for writing. "
            "Check that its directory exists and is writable, or leave trace_path empty.");
  file_ << "[\n";
  end_of_events_ = file_.tellp();
  add("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(rank_) +
      ",\"tid\":0,\"args\":{\"name\":" + json_quote("rank " + std::to_string(rank_)) + "}}");
  add("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(rank_) +
      ",\"tid\":0,\"args\":{\"sort_index\":" + std::to_string(rank_) + "}}");
  flush();
}

TraceWriter::~TraceWriter() {
  try {
    flush();
  } catch (...) {
    // A destructor must not throw; the file holds everything flushed before.
  }
}

void TraceWriter::add(std::string event) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back(std::move(event));
}

void TraceWriter::complete(const std::string& name, int track, int64_t start_us, int64_t dur_us,
                           const std::string& args_json) {
  std::string e = "{\"name\":" + json_quote(name) +
                  ",\"ph\":\"X\",\"pid\":" + std::to_string(rank_) +
                  ",\"tid\":" + std::to_string(track) + ",\"ts\":" + std::to_string(start_us) +
                  ",\"dur\":" + std::to_string(std::max<int64_t>(dur_us, 0));
  if (!args_json.empty()) e += ",\"args\":{" + args_json + "}";
  add(e + "}");
}

void TraceWriter::name_track(int track, const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::find(named_tracks_.begin(), named_tracks_.end(), track) != named_tracks_.end()) {
      return;
    }
    named_tracks_.push_back(track);
  }
  add("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(rank_) +
      ",\"tid\":" + std::to_string(track) + ",\"args\":{\"name\":" + json_quote(name) + "}}");
  add("{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(rank_) +
      ",\"tid\":" + std::to_string(track) + ",\"args\":{\"sort_index\":" + std::to_string(track) +
      "}}");
}

void TraceWriter::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Overwrite the previous closing bracket, append, close again.
  file_.seekp(end_of_events_);
  for (const auto& e : pending_) {
    if (!first_event_) file_ << ",\n";
    file_ << e;
    first_event_ = false;
  }
  pending_.clear();
  end_of_events_ = file_.tellp();
  file_ << "\n]\n";
  file_.flush();
}

}  // namespace detail

namespace trace {

Scope::Scope(const DistributedDataParallelBase& model, std::string name)
    : writer_(model.trace_writer()) {
  if (writer_) {
    name_ = std::move(name);
    start_us_ = detail::trace_now_us();
  }
}

Scope::~Scope() {
  if (!writer_) return;
  try {
    writer_->complete(name_, detail::kUserTrack, start_us_, detail::trace_now_us() - start_us_);
  } catch (...) {
  }
}

}  // namespace trace
}  // namespace ddp
