#include "metrics.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace fashion_mnist {

std::string to_json_line(const EpochMetrics& m) {
  nlohmann::ordered_json j;
  j["epoch"] = m.epoch;
  j["train_loss"] = m.train_loss;
  j["test_accuracy"] = m.test_accuracy;
  j["samples_per_s"] = m.samples_per_s;
  j["seconds"] = m.seconds;
  j["world_size"] = m.world_size;
  return j.dump();
}

std::vector<EpochMetrics> read_metrics(const std::string& path) {
  std::vector<EpochMetrics> out;
  std::ifstream in(path);
  if (!in) return out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      EpochMetrics m;
      m.epoch = j.at("epoch").get<int64_t>();
      m.train_loss = j.at("train_loss").get<double>();
      m.test_accuracy = j.at("test_accuracy").get<double>();
      m.samples_per_s = j.at("samples_per_s").get<double>();
      m.seconds = j.at("seconds").get<double>();
      m.world_size = j.at("world_size").get<int64_t>();
      out.push_back(m);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(
          path + ":" + std::to_string(number) +
          ": expected one JSON record per line with epoch, train_loss, test_accuracy, "
          "samples_per_s, seconds and world_size, got '" +
          line.substr(0, 80) + "' (" + e.what() +
          "; a line cut short by a full disk or a copy?). The lines before "
          "it are intact: delete this line and the ones after it, then resume again");
    }
  }
  return out;
}

void write_metrics(const std::string& path, const std::vector<EpochMetrics>& metrics) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& m : metrics) out << to_json_line(m) << '\n';
    out.flush();
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot rename " + tmp + " to " + path);
}

}  // namespace fashion_mnist
