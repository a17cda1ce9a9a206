#pragma once

// runs/<name>/metrics.jsonl: one JSON object per finished epoch, e.g.
//   {"epoch":1,"train_loss":0.512,"test_accuracy":0.8641,"samples_per_s":5210.3,
//    "seconds":11.5,"world_size":2}
// The file is rewritten whole after every epoch (atomically, via a temporary file and
// rename), so after --resume it holds exactly the epochs the resumed run has done.

#include <cstdint>
#include <string>
#include <vector>

namespace fashion_mnist {

struct EpochMetrics {
  int64_t epoch = 0;         // 1-based
  double train_loss = 0;     // mean over all ranks' batches of the epoch
  double test_accuracy = 0;  // fraction of the whole test set, 0..1
  double samples_per_s = 0;  // training samples of all ranks per second
  double seconds = 0;        // wall time of the epoch (training and evaluation)
  int64_t world_size = 1;
};

std::string to_json_line(const EpochMetrics& m);

/// Reads a metrics file; a missing file gives an empty list. Throws on a malformed line,
/// naming the file and line number.
std::vector<EpochMetrics> read_metrics(const std::string& path);

/// Writes all records, one per line, replacing `path` atomically.
void write_metrics(const std::string& path, const std::vector<EpochMetrics>& metrics);

}  // namespace fashion_mnist
