#pragma once

// What rank 0 shows while an epoch runs.
//
//   bar    one line redrawn in place with '\r': bar, samples/s, running loss, ETA
//   plain  one ordinary line every 10% of the epoch (log files, CI, pipes)
//   none   nothing until the epoch's summary line
//
// "auto" picks bar when stdout is a terminal, else plain. Under ddprun stdout is a pipe
// (ddprun prefixes each line with its rank), so auto gives plain there.

#include <chrono>
#include <cstdint>
#include <string>

namespace fashion_mnist {

enum class ProgressMode { kBar, kPlain, kNone };

/// "auto", "bar", "plain" or "none" -> a mode; "auto" looks at isatty(stdout).
ProgressMode parse_progress_mode(const std::string& name);

/// One epoch's progress, counted in samples over all ranks.
class EpochProgress {
 public:
  EpochProgress(ProgressMode mode, int64_t epoch, int64_t epochs, int64_t total_samples);
  /// `samples` done so far (all ranks) and the mean loss of this epoch so far.
  void update(int64_t samples, double running_loss);
  /// Clears the bar (the caller prints the epoch's summary line next).
  void finish();

 private:
  void draw(int64_t samples, double running_loss);

  ProgressMode mode_;
  int64_t epoch_;
  int64_t epochs_;
  int64_t total_;
  int next_decile_ = 1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool drawn_ = false;
};

/// Digits of `epochs`, so that "epoch  7/10" lines up with "epoch 10/10".
int epoch_width(int64_t epochs);

/// "1m05s", "42s", "3.4s".
std::string format_duration(double seconds);

}  // namespace fashion_mnist
