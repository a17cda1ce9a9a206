#pragma once

// gpu_check's cases: each runs, prints one line ("case <name>: ok ..." or "FAILED ...")
// and is counted, so that the program exits 1 if any failed.

#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>

namespace gpu_check {

// The cases of one suite, each printed and counted.
class Cases {
 public:
  explicit Cases(int rank) : rank_(rank) {}
  /// `body` returns its detail text; it throws, or returns a text starting with
  /// "FAILED", to fail.
  void run(const std::string& name, const std::function<std::string()>& body) {
    std::string detail;
    bool ok = true;
    try {
      detail = body();
      ok = detail.rfind("FAILED", 0) != 0;
    } catch (const c10::Error& e) {
      ok = false;
      detail = std::string("FAILED: ") + e.what_without_backtrace();
    } catch (const std::exception& e) {
      ok = false;
      detail = std::string("FAILED: ") + e.what();
    }
    failed_ += ok ? 0 : 1;
    if (rank_ == 0 || !ok) {
      const bool skipped = detail.rfind("skipped", 0) == 0;
      std::printf("gpu_check: case %s: %s%s\n", name.c_str(), ok && !skipped ? "ok " : "",
                  detail.c_str());
      std::fflush(stdout);
    }
  }
  int failed() const { return failed_; }

 private:
  int rank_;
  int failed_ = 0;
};

/// "<what> differs by <diff> (tolerance <tolerance>)", starting with "FAILED: " when
/// diff is over tolerance.
inline std::string verdict(double diff, double tolerance, const std::string& what) {
  char text[200];
  std::snprintf(text, sizeof(text), "%s%s differs by %.3g (tolerance %.3g)",
                diff <= tolerance ? "" : "FAILED: ", what.c_str(), diff, tolerance);
  return text;
}

}  // namespace gpu_check
