#pragma once

// What examples/gpt.cpp writes about a run:
//   <run>/metrics.jsonl  one JSON object per logged step, e.g.
//     {"step":50,"epoch":1,"train_loss":2.41,"val_loss":2.45,"tokens_per_s":21000.5,
//      "seconds":12.3,"world_size":2}
//     train_loss is the mean over every rank's micro-batches since the previous record;
//     val_loss is present on records where validation ran (each epoch's end, the last
//     step); seconds is the wall time since the run (or its --resume) started.
//     Rewritten whole (atomically) at each record, so after --resume it holds exactly
//     the steps the resumed run has done.
//   <run>/loss.svg       train and validation loss against the step.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpt {

struct StepMetrics {
  int64_t step = 0;                  // optimizer steps done
  int64_t epoch = 0;                 // 1-based epoch of that step
  std::optional<double> train_loss;  // absent when no step ran since the last record
  std::optional<double> val_loss;
  double tokens_per_s = 0;  // training tokens of all ranks per second since the last record
  double seconds = 0;
  int64_t world_size = 1;
};

/// Reads a metrics file; a missing file gives an empty list. Throws on a malformed line,
/// naming the file and line number.
std::vector<StepMetrics> read_metrics(const std::string& path);

/// Writes all records, one per line, replacing `path` atomically.
void write_metrics(const std::string& path, const std::vector<StepMetrics>& metrics);

/// A self-contained SVG line plot of train and validation loss against the step.
void write_loss_svg(const std::string& path, const std::vector<StepMetrics>& metrics,
                    const std::string& title);

}  // namespace gpt
