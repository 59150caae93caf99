#include "app/commands/train_eval/eval_summary.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace trainer {
namespace {

// JSON has no NaN: an undefined figure is null.
nlohmann::ordered_json number(double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nullptr; }

}  // namespace

std::string eval_summary_json(const EvalSummary& s) {
  nlohmann::ordered_json j;
  j["mode"] = "eval";
  j["weights"] = s.weights;
  j["dataset"] = s.dataset;
  j["images"] = s.images;
  j["skipped_images"] = s.skipped_images;
  j["loss"] = number(s.loss);
  j["top1"] = number(s.top1);
  j["top5"] = number(s.top5);
  j["auc"] = number(s.auc);
  j["per_class_accuracy"] = nlohmann::ordered_json::array();
  for (size_t c = 0; c < s.per_class_accuracy.size(); ++c) {
    const std::string name =
        c < s.class_names.size() && !s.class_names[c].empty() ? s.class_names[c] : std::to_string(c);
    j["per_class_accuracy"].push_back({{"class", name}, {"accuracy", number(s.per_class_accuracy[c])}});
  }
  // A path that is not UTF-8 must not lose the summary: such bytes become U+FFFD.
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

void write_eval_summary(const std::string& path, const EvalSummary& s) {
  std::ofstream out(path);
  out << eval_summary_json(s);
  if (!out.flush())
    throw std::runtime_error("cannot write the eval summary to " + path +
                             ". HINT: check that its directory exists and is writable");
}

}  // namespace trainer
