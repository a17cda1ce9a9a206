#pragma once

// runs/<name>/curves.svg: train loss (left axis) and test accuracy (right axis) per
// epoch, in one self-contained SVG file that any browser opens.

#include "metrics.h"

#include <string>
#include <vector>

namespace fashion_mnist {

/// The SVG document for `metrics` (epochs in any order; sorted by epoch).
std::string curves_svg(std::vector<EpochMetrics> metrics, const std::string& title);

/// Writes curves_svg(...) to `path`.
void write_curves_svg(const std::string& path, const std::vector<EpochMetrics>& metrics,
                      const std::string& title);

}  // namespace fashion_mnist
