#include "app/eval_summary.h"

#include <cmath>
#include <fstream>
#include <stdexcept>

#include "app/format.h"
#include "app/system_info.h"

namespace trainer {
namespace {

// JSON has no NaN: an undefined figure is null.
std::string number(double v) { return std::isfinite(v) ? fmt("%.10g", v) : "null"; }

}  // namespace

std::string eval_summary_json(const EvalSummary& s) {
  std::string out = "{\n  \"mode\": \"eval\",\n  \"weights\": " + json_quote(s.weights) +
                    ",\n  \"dataset\": " + json_quote(s.dataset) +
                    ",\n  \"images\": " + std::to_string(s.images) + ",\n  \"loss\": " + number(s.loss) +
                    ",\n  \"top1\": " + number(s.top1) + ",\n  \"top5\": " + number(s.top5) +
                    ",\n  \"auc\": " + number(s.auc) + ",\n  \"per_class_accuracy\": [";
  for (size_t c = 0; c < s.per_class_accuracy.size(); ++c) {
    const std::string name =
        c < s.class_names.size() && !s.class_names[c].empty() ? s.class_names[c] : std::to_string(c);
    out += std::string(c ? "," : "") + "\n    {\"class\": " + json_quote(name) +
           ", \"accuracy\": " + number(s.per_class_accuracy[c]) + "}";
  }
  return out + (s.per_class_accuracy.empty() ? "]\n}\n" : "\n  ]\n}\n");
}

void write_eval_summary(const std::string& path, const EvalSummary& s) {
  std::ofstream out(path);
  out << eval_summary_json(s);
  if (!out.flush())
    throw std::runtime_error("cannot write the eval summary to " + path +
                             ". HINT: check that its directory exists and is writable");
}

}  // namespace trainer
