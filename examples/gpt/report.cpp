#include "report.h"

#include "../common/files.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace gpt {
namespace {

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

// An integer field; a float ("step": 1e30) or a number past int64 is refused, not cast.
int64_t int_field(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() &&
       v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
    throw std::runtime_error(std::string("'") + key + "' should be an integer, but is " + v.dump());
  }
  return v.get<int64_t>();
}

}  // namespace

std::vector<StepMetrics> read_metrics(const std::string& path) {
  std::vector<StepMetrics> out;
  examples::read_json_lines(path, "step, epoch, tokens_per_s, seconds and world_size",
                            [&](const nlohmann::json& j) {
                              StepMetrics m;
                              m.step = int_field(j, "step");
                              m.epoch = int_field(j, "epoch");
                              if (j.contains("train_loss"))
                                m.train_loss = j.at("train_loss").get<double>();
                              if (j.contains("val_loss"))
                                m.val_loss = j.at("val_loss").get<double>();
                              m.tokens_per_s = j.at("tokens_per_s").get<double>();
                              m.seconds = j.at("seconds").get<double>();
                              m.world_size = int_field(j, "world_size");
                              out.push_back(m);
                            });
  return out;
}

void write_metrics(const std::string& path, const std::vector<StepMetrics>& metrics) {
  std::string text;
  for (const auto& m : metrics) {
    nlohmann::ordered_json j = {{"step", m.step}, {"epoch", m.epoch}};
    if (m.train_loss) j["train_loss"] = *m.train_loss;
    if (m.val_loss) j["val_loss"] = *m.val_loss;
    j["tokens_per_s"] = m.tokens_per_s;
    j["seconds"] = m.seconds;
    j["world_size"] = m.world_size;
    text += j.dump() + "\n";
  }
  examples::write_file_atomically(path, text);
}

void write_loss_svg(const std::string& path, const std::vector<StepMetrics>& metrics,
                    const std::string& title) {
  constexpr double kW = 760, kH = 440, kL = 70, kR = 730, kT = 50, kB = 380;
  double xmax = 1, ylo = 1e300, yhi = -1e300;
  for (const auto& m : metrics) {
    xmax = std::max(xmax, double(m.step));
    for (const auto& loss : {m.train_loss, m.val_loss}) {
      if (loss && std::isfinite(*loss)) ylo = std::min(ylo, *loss), yhi = std::max(yhi, *loss);
    }
  }
  if (!(yhi >= ylo)) ylo = 0, yhi = 1;  // no loss to draw
  if (!(yhi > ylo)) ylo -= 0.5, yhi += 0.5;
  const double ystep = examples::nice_step(yhi - ylo, 6), xstep = examples::nice_step(xmax, 8);
  ylo = std::floor(ylo / ystep) * ystep;
  yhi = std::ceil(yhi / ystep) * ystep;
  const double xhi = std::ceil(xmax / xstep) * xstep;
  auto X = [&](double v) { return kL + v / xhi * (kR - kL); };
  auto Y = [&](double v) { return kB - (v - ylo) / (yhi - ylo) * (kB - kT); };
  const int decimals = ystep >= 1 ? 0 : int(std::ceil(-std::log10(ystep) - 1e-9));
  const std::string yfmt = "%." + std::to_string(decimals) + "f";

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << kH
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << kW / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"15\">";
  for (char c : title)
    s << (c == '<' ? std::string("&lt;") : c == '&' ? std::string("&amp;") : std::string(1, c));
  s << "</text>\n";
  // Grid lines by count: near 1e16 adding a step to y would not change it.
  const int ylines = static_cast<int>(std::min(100.0, std::round((yhi - ylo) / ystep)));
  for (int i = 0; i <= ylines; ++i) {
    const double y = ylo + i * ystep;
    s << "<line x1=\"" << kL << "\" x2=\"" << kR << "\" y1=\"" << Y(y) << "\" y2=\"" << Y(y)
      << "\" stroke=\"#ddd\"/><text x=\"" << kL - 8 << "\" y=\"" << Y(y) + 4
      << "\" text-anchor=\"end\">" << fmt(yfmt.c_str(), y) << "</text>\n";
  }
  const int xlines = static_cast<int>(std::min(100.0, std::round(xhi / xstep)));
  for (int i = 0; i <= xlines; ++i) {
    const double x = i * xstep;
    s << "<text x=\"" << X(x) << "\" y=\"" << kB + 18 << "\" text-anchor=\"middle\">"
      << fmt("%.0f", x) << "</text>\n";
  }
  s << "<rect x=\"" << kL << "\" y=\"" << kT << "\" width=\"" << kR - kL << "\" height=\""
    << kB - kT << "\" fill=\"none\" stroke=\"#444\"/>\n"
    << "<text x=\"" << (kL + kR) / 2 << "\" y=\"" << kB + 40
    << "\" text-anchor=\"middle\">optimizer step</text>\n"
    << "<text x=\"18\" y=\"" << (kT + kB) / 2
    << "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " << (kT + kB) / 2
    << ")\">loss (cross-entropy, nats per character)</text>\n";
  std::string train, val;
  for (const auto& m : metrics) {
    if (m.train_loss) train += fmt("%.1f,", X(double(m.step))) + fmt("%.1f ", Y(*m.train_loss));
    if (m.val_loss) val += fmt("%.1f,", X(double(m.step))) + fmt("%.1f ", Y(*m.val_loss));
  }
  s << "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"" << train
    << "\"/>\n";
  s << "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"" << val << "\"/>\n";
  for (const auto& m : metrics)
    if (m.val_loss)
      s << "<circle cx=\"" << X(double(m.step)) << "\" cy=\"" << Y(*m.val_loss)
        << "\" r=\"3.5\" fill=\"#d62728\"/>\n";
  s << "<line x1=\"" << kR - 170 << "\" x2=\"" << kR - 145 << "\" y1=\"" << kT + 18 << "\" y2=\""
    << kT + 18 << "\" stroke=\"#1f77b4\" stroke-width=\"2\"/><text x=\"" << kR - 138 << "\" y=\""
    << kT + 22 << "\">train loss</text>\n"
    << "<line x1=\"" << kR - 170 << "\" x2=\"" << kR - 145 << "\" y1=\"" << kT + 38 << "\" y2=\""
    << kT + 38 << "\" stroke=\"#d62728\" stroke-width=\"2\"/><text x=\"" << kR - 138 << "\" y=\""
    << kT + 42 << "\">validation loss</text>\n</svg>\n";
  examples::write_file_atomically(path, s.str());
}

}  // namespace gpt
