#pragma once
// The run CSVs without their clock columns, for tests that compare two runs' files byte for byte (a
// resumed run against an uninterrupted one, 1 worker against 3): everything but the clock must match.
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace trainer::testing {

inline std::string without_wall_time(const std::string& csv) {
  std::istringstream in(csv);
  std::string line, out;
  while (std::getline(in, line)) {
    const std::size_t comma = line.rfind(',');
    out += (comma == std::string::npos ? line : line.substr(0, comma)) + '\n';
  }
  return out;
}

// metrics.csv without wall_time and images_per_second (found by the header's names).
inline std::string without_timing_columns(const std::string& csv) {
  const std::set<std::string> timing = {"wall_time", "images_per_second"};
  std::istringstream in(csv);
  std::string line, out;
  std::vector<bool> keep;
  for (bool header = true; std::getline(in, line); header = false) {
    std::vector<std::string> cells;
    std::istringstream fields(line);
    for (std::string c; std::getline(fields, c, ',');) cells.push_back(c);
    if (!line.empty() && line.back() == ',') cells.emplace_back();
    if (header)
      for (const std::string& c : cells) keep.push_back(!timing.count(c));
    std::string row;
    for (std::size_t i = 0; i < cells.size(); ++i)
      if (i >= keep.size() || keep[i]) row += (row.empty() ? "" : ",") + cells[i];
    out += row + '\n';
  }
  return out;
}

}  // namespace trainer::testing
