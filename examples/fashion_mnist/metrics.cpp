#include "metrics.h"

#include "../common/files.h"

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
  examples::read_json_lines(
      path, "epoch, train_loss, test_accuracy, samples_per_s, seconds and world_size",
      [&](const nlohmann::json& j) {
        EpochMetrics m;
        m.epoch = j.at("epoch").get<int64_t>();
        m.train_loss = j.at("train_loss").get<double>();
        m.test_accuracy = j.at("test_accuracy").get<double>();
        m.samples_per_s = j.at("samples_per_s").get<double>();
        m.seconds = j.at("seconds").get<double>();
        m.world_size = j.at("world_size").get<int64_t>();
        out.push_back(m);
      });
  return out;
}

void write_metrics(const std::string& path, const std::vector<EpochMetrics>& metrics) {
  std::string text;
  for (const auto& m : metrics) text += to_json_line(m) + "\n";
  examples::write_file_atomically(path, text);
}

}  // namespace fashion_mnist
