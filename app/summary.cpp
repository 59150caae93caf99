#include "app/summary.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace trainer {
namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

}  // namespace

std::string summary_json(const RunSummary& s) {
  std::ostringstream o;
  o.precision(10);
  o << "{\n"
    << "  \"epochs\": " << s.epochs << ",\n"
    << "  \"steps\": " << s.steps << ",\n"
    << "  \"world_size\": " << s.world_size << ",\n"
    << "  \"train_seconds\": " << s.train_seconds << ",\n"
    << "  \"samples_per_second\": " << s.samples_per_second << ",\n"
    << "  \"final_test_accuracy\": " << s.final_test_accuracy << ",\n"
    << "  \"best_test_accuracy\": " << s.best_test_accuracy << ",\n"
    << "  \"final_test_top5\": " << s.final_test_top5 << ",\n"
    << "  \"final_test_loss\": " << s.final_test_loss << ",\n"
    << "  \"final_test_skipped_samples\": " << s.final_test_skipped << ",\n"
    << "  \"final_train_loss\": " << s.final_train_loss << ",\n"
    << "  \"run_dir\": " << json_string(s.run_dir) << ",\n"
    << "  \"weights\": " << json_string(s.weights) << "\n"
    << "}\n";
  return o.str();
}

void write_summary(const std::string& path, const RunSummary& s) {
  std::ofstream out(path);
  out << summary_json(s);
  if (!out) throw std::runtime_error("cannot write summary to " + path);
}

}  // namespace trainer
