// Writing a Config back out: as TOML (for checkpoints and `trainer config`) and as a table for people.
// Both walk the schema, so they list every key in the same order as configs/reference.toml.
#include <algorithm>
#include <filesystem>
#include <type_traits>

#include "app/config/config.h"
#include "app/config/config_schema.h"

namespace trainer {

namespace schema = config_schema;

namespace {

std::string toml_value(bool value) { return value ? "true" : "false"; }
std::string toml_value(int value) { return std::to_string(value); }
std::string toml_value(std::int64_t value) { return std::to_string(value); }
std::string toml_value(double value) { return schema::toml_float(value); }
std::string toml_value(const std::string& value) { return schema::toml_quote(value); }
template <Setting E>
std::string toml_value(E value) {
  return schema::toml_quote(setting_name(value));
}

template <typename E>
std::string toml_value(const std::vector<E>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + toml_value(values[i]);
  return out + "]";
}

// The source column of config_table: the file position, "--set" or "default".
std::string source_label(const Config& config, const std::string& dotted) {
  auto it = config.origin.find(dotted);
  if (it == config.origin.end() || it->second == schema::kDefaultOrigin) return "default";
  if (it->second.rfind("--set ", 0) == 0) return "--set";
  return it->second;
}

}  // namespace

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  const Config defaults;
  schema::visit_fields(defaults, [&](const char* section, const char* key, const auto&, const schema::Rule&) {
    keys.push_back(std::string(section) + "." + key);
  });
  return keys;
}

namespace {

// Every key as `key = value` under its section's header, in the schema's order; with `annotate`, a
// value with a special meaning says it beside it.
std::string toml_sections(const Config& config, bool annotate) {
  std::string out, current_section;
  schema::visit_fields(
      config, [&](const char* section, const char* key, const auto& value, const schema::Rule& rule) {
        if (current_section != section) {
          current_section = section;
          out += "\n[" + current_section + "]\n";
        }
        out += std::string(key) + " = " + toml_value(value);
        if constexpr (std::is_arithmetic_v<std::decay_t<decltype(value)>>) {
          if (annotate && rule.special && static_cast<double>(value) == *rule.special)
            out += "  # " + rule.special_meaning;
        }
        out += "\n";
      });
  return out;
}

}  // namespace

std::string config_to_toml(const Config& config) {
  std::string out = "# trainer configuration, fully resolved: every key, defaults included.\n";
  if (!config.source_path.empty()) out += "# Loaded from " + config.source_path + ".\n";
  return out + toml_sections(config, false);
}

std::string config_to_editable_toml(const Config& config) {
  return "# trainer configuration, fully resolved (`trainer config --format toml`): every key, defaults\n"
         "# included. Values with a special meaning say it beside them; `trainer train` takes this file.\n" +
         toml_sections(config, true);
}

std::string config_table(const Config& config) {
  struct Row {
    std::string key, value, source;
  };
  std::vector<Row> rows;
  std::size_t key_width = 0, value_width = 0;
  schema::visit_fields(config,
                       [&](const char* section, const char* key, const auto& value, const schema::Rule&) {
                         Row row{std::string(section) + "." + key, toml_value(value), ""};
                         row.source = source_label(config, row.key);
                         key_width = std::max(key_width, row.key.size());
                         value_width = std::max(value_width, row.value.size());
                         rows.push_back(std::move(row));
                       });
  std::string out;
  for (const auto& row : rows) {
    out += row.key + std::string(key_width - row.key.size() + 2, ' ') + row.value +
           std::string(value_width - row.value.size() + 2, ' ') + "[" + row.source + "]\n";
  }
  for (const std::string& warning : config.warnings) out += "warning: " + warning + "\n";
  return out;
}

std::string default_run_dir(const Config& config, std::time_t now) {
  std::string stem = std::filesystem::path(config.source_path).stem().string();
  if (stem.empty()) stem = "run";
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
  return "runs/" + stem + "-" + stamp;
}

}  // namespace trainer
