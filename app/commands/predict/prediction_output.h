#pragma once
// What `trainer predict` prints for each file, in the order the files were given: its top-k classes
// with probabilities (softmax of the logits), or what is wrong with the file.
//   table  one line a file: the path, then "name 97.12%" best first (for people)
//   jsonl  one JSON object a line: {"path", "top": [{"class", "index", "probability"}...]} or
//          {"path", "error"}
//   csv    a header, then one row per file and rank: path,rank,index,class,probability,error
// A model without class names (weights with no model card) names classes by their index.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace trainer {

enum class PredictionFormat { table, jsonl, csv };

// "table", "jsonl" or "csv"; UsageError otherwise.
PredictionFormat parse_prediction_format(const std::string& text);

struct ClassScore {
  int64_t index = 0;
  double probability = 0.0;
};

// The k most probable classes of one row of logits, best first (ties: the lower index first, as
// argmax); k is capped at the class count. Softmax in double.
std::vector<ClassScore> top_classes(const float* logits, int64_t classes, int64_t k);

class PredictionWriter {
 public:
  // path_width: the table's first column (the longest path, capped).
  PredictionWriter(std::FILE* out, PredictionFormat format, std::vector<std::string> class_names,
                   size_t path_width);
  void header();
  void prediction(const std::string& path, const std::vector<ClassScore>& top);
  void failure(const std::string& path, const std::string& problem);

 private:
  std::string class_name(int64_t index) const;

  std::FILE* out_;
  PredictionFormat format_;
  std::vector<std::string> class_names_;
  size_t path_width_;
};

}  // namespace trainer
