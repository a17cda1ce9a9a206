#include "files.h"

#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace examples {

void read_json_lines(const std::string& path, const std::string& fields,
                     const std::function<void(const nlohmann::json&)>& parse) {
  std::ifstream in(path);
  if (!in) return;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    try {
      parse(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(
          path + ":" + std::to_string(number) + ": expected one JSON record per line with " +
          fields + ", got '" + line.substr(0, 80) + "' (" + e.what() +
          "; a line cut short by a full disk or a copy?). The lines before it are intact: "
          "delete this line and the ones after it, then resume again");
    }
  }
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot rename " + tmp + " to " + path);
}

}  // namespace examples
