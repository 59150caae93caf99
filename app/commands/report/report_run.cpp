#include "app/commands/report/report_run.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "app/common/format.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream s(line);
  for (std::string f; std::getline(s, f, ',');) out.push_back(f);
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

double parse_number(const std::string& text) {
  if (text.empty()) return NAN;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  return end == text.c_str() ? NAN : v;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// summary.json's values as table text: whole numbers without decimals, fractions to 4 digits.
std::string json_text(const nlohmann::ordered_json& v) {
  if (v.is_null()) return "n/a";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return d == std::floor(d) && std::abs(d) < 1e15 ? fmt("%.0f", d) : fmt("%.4g", d);
  }
  return v.dump();
}

// The global batch: data.batch_size x train.grad_accum_steps from config.toml, times the world size
// (summary.json, else one rank plus a train.rank<N>.log per other rank).
// The config keys that tell runs apart in the summary table, as TOML writes their values.
std::vector<std::pair<std::string, std::string>> config_keys(const fs::path& path) {
  std::vector<std::pair<std::string, std::string>> out;
  toml::table config;
  try {
    config = toml::parse_file(path.string());
  } catch (const toml::parse_error&) {
    return out;
  }
  for (const char* key : {"model.name", "data.dataset", "data.batch_size", "train.epochs", "train.precision",
                          "optim.name", "optim.lr", "schedule.name"}) {
    const toml::node_view<toml::node> node = config.at_path(key);
    if (!node) continue;
    std::stringstream text;
    if (const auto* s = node.as_string())
      text << s->get();
    else if (const auto* f = node.as_floating_point())
      text << fmt("%.6g", f->get());  // 0.1, not 0.10000000000000001
    else
      text << node;
    out.emplace_back(key, text.str());
  }
  return out;
}

int64_t images_per_step(const fs::path& dir, const ReportRun& run) {
  if (!fs::exists(dir / "config.toml")) return 0;
  int64_t batch = 0, accum = 1;
  try {
    const toml::table config = toml::parse_file((dir / "config.toml").string());
    batch = config["data"]["batch_size"].value_or<int64_t>(0);
    accum = config["train"]["grad_accum_steps"].value_or<int64_t>(1);
  } catch (const toml::parse_error&) {
    return 0;
  }
  int64_t world = 0;
  for (const auto& [key, value] : run.summary)
    if (key == "world_size") world = std::atoll(value.c_str());
  if (world <= 0) {
    world = 1;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string n = entry.path().filename().string();
      if (n.rfind("train.rank", 0) == 0 && n.size() > 4 && n.substr(n.size() - 4) == ".log") ++world;
    }
  }
  return batch * std::max<int64_t>(1, accum) * world;
}

// metrics.csv (one row per evaluated epoch) into epochs.
std::vector<ReportEpoch> epochs_from_metrics(const std::map<std::string, std::vector<double>>& m) {
  auto column = [&](const char* name) -> const std::vector<double>* {
    const auto it = m.find(name);
    return it == m.end() ? nullptr : &it->second;
  };
  const std::vector<double>* epoch = column("epoch");
  std::vector<ReportEpoch> out;
  if (!epoch) return out;
  auto at = [&](const char* name, size_t i) {
    const std::vector<double>* c = column(name);
    return c && i < c->size() ? (*c)[i] : NAN;
  };
  for (size_t i = 0; i < epoch->size(); ++i) {
    ReportEpoch e;
    e.epoch = static_cast<int>((*epoch)[i]);
    e.step = at("step", i);
    e.train_loss = at("train_loss", i);
    e.eval_loss = at("eval_loss", i);
    e.top1 = at("eval_top1", i);
    e.top5 = at("eval_top5", i);
    e.auc = at("eval_auc", i);
    e.images_per_second = at("images_per_second", i);
    e.wall_time = at("wall_time", i);
    out.push_back(e);
  }
  return out;
}

}  // namespace

std::map<std::string, std::vector<double>> read_numeric_csv(const fs::path& path) {
  std::map<std::string, std::vector<double>> columns;
  std::ifstream in(path);
  std::string header;
  if (!in || !std::getline(in, header)) return columns;
  const std::vector<std::string> names = split_fields(header);
  for (const std::string& n : names) columns[n];
  std::string line;
  while (std::getline(in, line)) {
    const bool complete = !in.eof();  // a last line without its newline may still be being written
    const std::vector<std::string> fields = split_fields(line);
    if (fields.size() != names.size() || !complete) continue;
    for (size_t i = 0; i < names.size(); ++i) columns[names[i]].push_back(parse_number(fields[i]));
  }
  return columns;
}

std::vector<ReportEpoch> parse_epoch_lines(const std::string& log_text) {
  static const std::regex line_re(
      R"(epoch (\d+)/\d+: train loss ([^,]+), [0-9.]+s, ([0-9.]+) img/s(?: \| test loss (\S+) top1 ([0-9.]+)% top5 ([0-9.]+)%(?: auc ([0-9.]+))?)?)");
  std::vector<ReportEpoch> out;
  std::stringstream s(log_text);
  for (std::string line; std::getline(s, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, line_re)) continue;
    ReportEpoch e;
    e.epoch = std::atoi(m[1].str().c_str());
    e.train_loss = parse_number(m[2].str());
    e.images_per_second = parse_number(m[3].str());
    if (m[4].matched) {
      e.eval_loss = parse_number(m[4].str());
      e.top1 = parse_number(m[5].str()) / 100;
      e.top5 = parse_number(m[6].str()) / 100;
      if (m[7].matched) e.auc = parse_number(m[7].str());
    }
    // A resumed run logs its epochs again from the checkpoint on: the later line wins.
    std::erase_if(out, [&](const ReportEpoch& o) { return o.epoch == e.epoch; });
    out.push_back(e);
  }
  return out;
}

ReportRun read_report_run(const fs::path& dir) {
  if (!fs::is_directory(dir)) throw std::runtime_error("report: " + dir.string() + " is not a directory");
  const bool has_steps = fs::exists(dir / "train_steps.csv"), has_metrics = fs::exists(dir / "metrics.csv");
  const bool has_log = fs::exists(dir / "train.log"), has_summary = fs::exists(dir / "summary.json");
  if (!has_steps && !has_metrics && !has_log && !has_summary)
    throw std::runtime_error("report: " + dir.string() +
                             " is not a run directory: it has no train_steps.csv, metrics.csv, train.log or "
                             "summary.json. HINT: pass the train.run_dir of a `trainer train` run (printed "
                             "as \"run directory:\" at its start)");
  ReportRun run;
  run.dir = dir;
  run.name = fs::absolute(dir).lexically_normal().filename().string();
  if (run.name.empty()) run.name = fs::absolute(dir).lexically_normal().parent_path().filename().string();

  if (has_summary) {
    try {
      const auto j = nlohmann::ordered_json::parse(read_text(dir / "summary.json"));
      for (const auto& [key, value] : j.items()) run.summary.emplace_back(key, json_text(value));
    } catch (const nlohmann::json::exception& e) {
      run.notes.push_back(std::string("summary.json is not valid JSON (") + e.what() + ")");
    }
  } else {
    run.notes.push_back("no summary.json: the run is still training or was stopped");
  }

  if (has_steps) {
    auto steps = read_numeric_csv(dir / "train_steps.csv");
    run.step = steps["step"];
    run.epoch_of_step = steps["epoch"];
    run.loss = steps["loss"];
    run.lr = steps["lr"];
    if (steps.count("wall_time")) run.wall_time = steps["wall_time"];
  } else {
    run.notes.push_back("no train_steps.csv: no per-step loss or learning rate");
  }

  if (has_metrics) {
    run.epochs = epochs_from_metrics(read_numeric_csv(dir / "metrics.csv"));
    run.epochs_source = "metrics.csv";
  }
  if (run.epochs.empty() && has_log) {
    run.epochs = parse_epoch_lines(read_text(dir / "train.log"));
    run.epochs_source = "train.log";
    if (!has_metrics) run.notes.push_back("no metrics.csv: per-epoch figures read from train.log");
  }
  // Epoch points sit at their last step on step axes; train_steps.csv says which step that was.
  for (ReportEpoch& e : run.epochs) {
    if (!std::isnan(e.step)) continue;
    for (size_t i = 0; i < run.step.size() && i < run.epoch_of_step.size(); ++i)
      if (run.epoch_of_step[i] == e.epoch) e.step = run.step[i];
  }

  if (fs::exists(dir / "step_times.csv"))
    run.step_times = read_numeric_csv(dir / "step_times.csv");
  else
    run.notes.push_back("no step_times.csv: no step-phase breakdown or per-step throughput");
  run.images_per_step = images_per_step(dir, run);
  if (fs::exists(dir / "config.toml")) run.config = config_keys(dir / "config.toml");
  return run;
}

}  // namespace trainer
