#include "app/commands/predict/prediction_output.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "app/common/cli.h"
#include "app/common/format.h"

namespace trainer {
namespace {

// RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::string json_line(const nlohmann::ordered_json& j) {
  // Paths that are not UTF-8 must not stop the output: such bytes become U+FFFD.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace

PredictionFormat parse_prediction_format(const std::string& text) {
  if (text.empty() || text == "table") return PredictionFormat::table;
  if (text == "jsonl") return PredictionFormat::jsonl;
  if (text == "csv") return PredictionFormat::csv;
  throw UsageError("--format expects table, jsonl or csv, got '" + text + "'");
}

std::vector<ClassScore> top_classes(const float* logits, int64_t classes, int64_t k) {
  const double top = *std::max_element(logits, logits + classes);
  double sum = 0.0;
  for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(logits[c]) - top);
  std::vector<int64_t> order(static_cast<size_t>(classes));
  std::iota(order.begin(), order.end(), 0);
  const auto kept = order.begin() + std::min(k, classes);
  std::partial_sort(order.begin(), kept, order.end(), [&](int64_t a, int64_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  std::vector<ClassScore> out;
  for (auto it = order.begin(); it != kept; ++it)
    out.push_back({*it, std::exp(static_cast<double>(logits[*it]) - top) / sum});
  return out;
}

PredictionWriter::PredictionWriter(std::FILE* out, PredictionFormat format,
                                   std::vector<std::string> class_names, size_t path_width)
    : out_(out), format_(format), class_names_(std::move(class_names)), path_width_(path_width) {}

std::string PredictionWriter::class_name(int64_t index) const {
  return index < static_cast<int64_t>(class_names_.size()) ? class_names_[static_cast<size_t>(index)]
                                                           : std::to_string(index);
}

void PredictionWriter::header() {
  if (format_ == PredictionFormat::csv) std::fputs("path,rank,index,class,probability,error\n", out_);
  if (format_ == PredictionFormat::table)
    std::fprintf(out_, "%-*s  %s\n", static_cast<int>(path_width_), "file", "classes, most probable first");
}

void PredictionWriter::prediction(const std::string& path, const std::vector<ClassScore>& top) {
  if (format_ == PredictionFormat::jsonl) {
    nlohmann::ordered_json j{{"path", path}, {"top", nlohmann::ordered_json::array()}};
    for (const ClassScore& s : top)
      j["top"].push_back(
          {{"class", class_name(s.index)}, {"index", s.index}, {"probability", s.probability}});
    std::fputs(json_line(j).c_str(), out_);
  } else if (format_ == PredictionFormat::csv) {
    for (size_t r = 0; r < top.size(); ++r)
      std::fprintf(out_, "%s,%zu,%lld,%s,%.6f,\n", csv_field(path).c_str(), r + 1,
                   static_cast<long long>(top[r].index), csv_field(class_name(top[r].index)).c_str(),
                   top[r].probability);
  } else {
    std::string line = path + std::string(path_width_ > path.size() ? path_width_ - path.size() : 0, ' ');
    for (const ClassScore& s : top)
      line += fmt("  %s %.2f%%", class_name(s.index).c_str(), 100 * s.probability);
    std::fprintf(out_, "%s\n", line.c_str());
  }
}

void PredictionWriter::failure(const std::string& path, const std::string& problem) {
  if (format_ == PredictionFormat::jsonl)
    std::fputs(json_line({{"path", path}, {"error", problem}}).c_str(), out_);
  else if (format_ == PredictionFormat::csv)
    std::fprintf(out_, "%s,,,,,%s\n", csv_field(path).c_str(), csv_field(problem).c_str());
  else
    std::fprintf(out_, "%-*s  error: %s\n", static_cast<int>(path_width_), path.c_str(), problem.c_str());
}

}  // namespace trainer
