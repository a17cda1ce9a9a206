#include "plot.h"

#include "../common/files.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fashion_mnist {
namespace {

constexpr double kWidth = 760, kHeight = 440;
constexpr double kLeft = 80, kRight = 680, kTop = 60, kBottom = 370;  // the frame
constexpr double kInset = 14;  // data stay this far inside the frame, markers whole
constexpr const char* kLossColor = "#1f77b4";
constexpr const char* kAccuracyColor = "#d62728";

struct Axis {
  double lo, hi, step;
  double map(double v, double out_lo, double out_hi) const {
    return out_lo + (v - lo) / (hi - lo) * (out_hi - out_lo);
  }
};

// An axis from lo to hi widened to whole ticks.
Axis nice_axis(double lo, double hi, int ticks) {
  if (!(hi > lo)) {
    const double pad = std::max(std::abs(hi) * 0.1, 0.5);
    lo -= pad;
    hi += pad;
  }
  const double step = examples::nice_step(hi - lo, ticks);
  return {std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step, step};
}

std::string fmt(double v, int decimals) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

int decimals_for(double step) {
  return step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string curves_svg(std::vector<EpochMetrics> metrics, const std::string& title) {
  std::sort(metrics.begin(), metrics.end(),
            [](const EpochMetrics& a, const EpochMetrics& b) { return a.epoch < b.epoch; });
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
    << "\" viewBox=\"0 0 " << kWidth << ' ' << kHeight
    << "\" font-family=\"sans-serif\" font-size=\"13\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << kWidth / 2 << "\" y=\"30\" text-anchor=\"middle\" font-size=\"16\">"
    << escape(title) << "</text>\n";
  if (metrics.empty()) {
    s << "<text x=\"" << kWidth / 2 << "\" y=\"" << kHeight / 2
      << "\" text-anchor=\"middle\">no finished epochs yet</text>\n</svg>\n";
    return s.str();
  }

  // Axes: epochs (x), loss from 0 (left), accuracy in percent (right).
  const double first = double(metrics.front().epoch), last = double(metrics.back().epoch);
  Axis x = last > first ? Axis{first, last, examples::nice_step(last - first, 8)}
                        : Axis{first - 1, first + 1, 1};
  x.step = std::max(1.0, std::round(x.step));
  double max_loss = 0, min_acc = 100, max_acc = 0;
  for (const auto& m : metrics) {
    max_loss = std::max(max_loss, m.train_loss);
    min_acc = std::min(min_acc, 100 * m.test_accuracy);
    max_acc = std::max(max_acc, 100 * m.test_accuracy);
  }
  const Axis loss = nice_axis(0, max_loss, 5);
  Axis acc = nice_axis(min_acc, max_acc, 5);
  acc.lo = std::max(0.0, acc.lo);
  acc.hi = std::min(100.0, acc.hi);
  auto px = [&](double v) { return x.map(v, kLeft + kInset, kRight - kInset); };
  auto py_loss = [&](double v) { return loss.map(v, kBottom - kInset, kTop + kInset); };
  auto py_acc = [&](double v) { return acc.map(v, kBottom - kInset, kTop + kInset); };

  // Grid and ticks.
  s << "<g stroke=\"#e0e0e0\">\n";
  for (double v = loss.lo; v <= loss.hi + loss.step / 2; v += loss.step)
    s << "<line x1=\"" << kLeft << "\" x2=\"" << kRight << "\" y1=\"" << py_loss(v) << "\" y2=\""
      << py_loss(v) << "\"/>\n";
  s << "</g>\n<g font-size=\"12\">\n";
  const int xt = static_cast<int>(std::ceil(x.lo));
  for (double v = xt; v <= x.hi + 1e-9; v += x.step) {
    if (v < 0.5) continue;  // epochs start at 1
    s << "<line x1=\"" << px(v) << "\" x2=\"" << px(v) << "\" y1=\"" << kBottom << "\" y2=\""
      << kBottom + 5 << "\" stroke=\"black\"/><text x=\"" << px(v) << "\" y=\"" << kBottom + 20
      << "\" text-anchor=\"middle\">" << fmt(v, 0) << "</text>\n";
  }
  const int loss_decimals = decimals_for(loss.step);
  for (double v = loss.lo; v <= loss.hi + loss.step / 2; v += loss.step)
    s << "<line x1=\"" << kLeft - 5 << "\" x2=\"" << kLeft << "\" y1=\"" << py_loss(v) << "\" y2=\""
      << py_loss(v) << "\" stroke=\"black\"/><text x=\"" << kLeft - 8 << "\" y=\"" << py_loss(v) + 4
      << "\" text-anchor=\"end\" fill=\"" << kLossColor << "\">" << fmt(v, loss_decimals)
      << "</text>\n";
  const int acc_decimals = decimals_for(acc.step);
  for (double v = acc.lo; v <= acc.hi + acc.step / 2; v += acc.step)
    s << "<line x1=\"" << kRight << "\" x2=\"" << kRight + 5 << "\" y1=\"" << py_acc(v)
      << "\" y2=\"" << py_acc(v) << "\" stroke=\"black\"/><text x=\"" << kRight + 8 << "\" y=\""
      << py_acc(v) + 4 << "\" fill=\"" << kAccuracyColor << "\">" << fmt(v, acc_decimals)
      << "</text>\n";
  s << "</g>\n";

  // Frame and axis labels.
  s << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << kRight - kLeft
    << "\" height=\"" << kBottom - kTop << "\" fill=\"none\" stroke=\"black\"/>\n"
    << "<text x=\"" << (kLeft + kRight) / 2 << "\" y=\"" << kBottom + 45
    << "\" text-anchor=\"middle\">epoch</text>\n"
    << "<text transform=\"translate(25," << (kTop + kBottom) / 2
    << ") rotate(-90)\" text-anchor=\"middle\" fill=\"" << kLossColor << "\">train loss</text>\n"
    << "<text transform=\"translate(" << kWidth - 20 << ',' << (kTop + kBottom) / 2
    << ") rotate(90)\" text-anchor=\"middle\" fill=\"" << kAccuracyColor
    << "\">test accuracy (%)</text>\n";

  // The two series: a line through the points, and a marker at each.
  auto series = [&](const char* color, auto value, auto py, bool squares) {
    s << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
    for (const auto& m : metrics) s << px(double(m.epoch)) << ',' << py(value(m)) << ' ';
    s << "\"/>\n";
    for (const auto& m : metrics) {
      const double cx = px(double(m.epoch)), cy = py(value(m));
      if (squares)
        s << "<rect x=\"" << cx - 4 << "\" y=\"" << cy - 4 << "\" width=\"8\" height=\"8\" fill=\""
          << color << "\"/>\n";
      else
        s << "<circle cx=\"" << cx << "\" cy=\"" << cy << "\" r=\"4\" fill=\"" << color << "\"/>\n";
    }
  };
  series(
      kLossColor, [](const EpochMetrics& m) { return m.train_loss; }, py_loss, false);
  series(
      kAccuracyColor, [](const EpochMetrics& m) { return 100 * m.test_accuracy; }, py_acc, true);
  // The final accuracy, written next to its point.
  const double final_acc = 100 * metrics.back().test_accuracy;
  s << "<text x=\"" << px(last) - 6 << "\" y=\"" << py_acc(final_acc) - 10
    << "\" text-anchor=\"end\" fill=\"" << kAccuracyColor << "\">" << fmt(final_acc, 2)
    << "%</text>\n";

  // Legend, top middle of the plot area (loss falls from the left, accuracy rises to
  // the right, so the middle top is usually free).
  const double lx = (kLeft + kRight) / 2 - 80, ly = kTop + 12;
  s << "<g><rect x=\"" << lx << "\" y=\"" << ly << "\" width=\"160\" height=\"46\" "
    << "fill=\"white\" fill-opacity=\"0.85\" stroke=\"#999\"/>\n"
    << "<line x1=\"" << lx + 10 << "\" x2=\"" << lx + 34 << "\" y1=\"" << ly + 15 << "\" y2=\""
    << ly + 15 << "\" stroke=\"" << kLossColor << "\" stroke-width=\"2\"/>"
    << "<circle cx=\"" << lx + 22 << "\" cy=\"" << ly + 15 << "\" r=\"4\" fill=\"" << kLossColor
    << "\"/><text x=\"" << lx + 42 << "\" y=\"" << ly + 19 << "\">train loss</text>\n"
    << "<line x1=\"" << lx + 10 << "\" x2=\"" << lx + 34 << "\" y1=\"" << ly + 33 << "\" y2=\""
    << ly + 33 << "\" stroke=\"" << kAccuracyColor << "\" stroke-width=\"2\"/>"
    << "<rect x=\"" << lx + 18 << "\" y=\"" << ly + 29 << "\" width=\"8\" height=\"8\" fill=\""
    << kAccuracyColor << "\"/><text x=\"" << lx + 42 << "\" y=\"" << ly + 37
    << "\">test accuracy (%)</text></g>\n";
  s << "</svg>\n";
  return s.str();
}

void write_curves_svg(const std::string& path, const std::vector<EpochMetrics>& metrics,
                      const std::string& title) {
  std::ofstream out(path, std::ios::trunc);
  out << curves_svg(metrics, title);
  out.flush();
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace fashion_mnist
