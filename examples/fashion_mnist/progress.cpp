#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace fashion_mnist {

ProgressMode parse_progress_mode(const std::string& name) {
  if (name == "bar") return ProgressMode::kBar;
  if (name == "plain") return ProgressMode::kPlain;
  if (name == "none") return ProgressMode::kNone;
  if (name == "auto") return ::isatty(STDOUT_FILENO) ? ProgressMode::kBar : ProgressMode::kPlain;
  throw std::invalid_argument("--progress must be auto, bar, plain or none, but got '" + name +
                              "'");
}

int epoch_width(int64_t epochs) { return static_cast<int>(std::to_string(epochs).size()); }

std::string format_duration(double seconds) {
  char buf[32];
  if (seconds < 10) {
    std::snprintf(buf, sizeof(buf), "%.1fs", seconds);
  } else if (seconds < 60) {
    std::snprintf(buf, sizeof(buf), "%.0fs", seconds);
  } else {
    const long s = static_cast<long>(seconds + 0.5);
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  }
  return buf;
}

EpochProgress::EpochProgress(ProgressMode mode, int64_t epoch, int64_t epochs,
                             int64_t total_samples)
    : mode_(mode),
      epoch_(epoch),
      epochs_(epochs),
      total_(std::max<int64_t>(total_samples, 1)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void EpochProgress::update(int64_t samples, double running_loss) {
  samples = std::min(samples, total_);
  if (mode_ == ProgressMode::kPlain) {
    // One line each time the epoch crosses another 10%.
    const int decile = static_cast<int>(samples * 10 / total_);
    if (decile >= next_decile_ && decile < 10) {
      next_decile_ = decile + 1;
      draw(samples, running_loss);
    }
  } else if (mode_ == ProgressMode::kBar) {
    // Redraw at most 10 times a second: a terminal is slow to scroll, training is not.
    const auto now = std::chrono::steady_clock::now();
    if (!drawn_ || now - last_draw_ >= std::chrono::milliseconds(100) || samples == total_) {
      last_draw_ = now;
      draw(samples, running_loss);
    }
  }
}

void EpochProgress::finish() {
  if (mode_ == ProgressMode::kBar && drawn_) {
    std::printf("\r\033[K");  // back to column 0 and clear the line
    std::fflush(stdout);
  }
}

void EpochProgress::draw(int64_t samples, double running_loss) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = elapsed > 0 ? samples / elapsed : 0.0;
  const double eta = rate > 0 ? (total_ - samples) / rate : 0.0;
  const int percent = static_cast<int>(samples * 100 / total_);
  char head[64];
  std::snprintf(head, sizeof(head), "epoch %*lld/%lld", epoch_width(epochs_),
                static_cast<long long>(epoch_), static_cast<long long>(epochs_));
  if (mode_ == ProgressMode::kBar) {
    // Under 80 columns, so that the line never wraps (a wrapped line cannot be redrawn).
    constexpr int kWidth = 20;
    const int filled = static_cast<int>(samples * kWidth / total_);
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    std::printf("\r%s [%s] %3d%%  %.0f samples/s  loss %.4f  ETA %s\033[K", head, bar.c_str(),
                percent, rate, running_loss, format_duration(eta).c_str());
  } else {
    std::printf("%s  %3d%%  %lld/%lld samples  %.0f samples/s  loss %.4f  ETA %s\n", head, percent,
                static_cast<long long>(samples), static_cast<long long>(total_), rate, running_loss,
                format_duration(eta).c_str());
  }
  std::fflush(stdout);
  drawn_ = true;
}

}  // namespace fashion_mnist
