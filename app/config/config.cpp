// Loading: parse the file, merge --set overrides into the parsed tree, then check the tree against the
// schema (unknown sections and keys, types, ranges, cross-key rules). Problems are collected rather
// than thrown one at a time, so a user fixes a config in one round trip instead of one per mistake.
#include "app/config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <tuple>
#include <type_traits>

#include "app/config/config_schema.h"

namespace trainer {

namespace schema = config_schema;

namespace {

template <typename T>
struct IsVector : std::false_type {};
template <typename E>
struct IsVector<std::vector<E>> : std::true_type {};

template <typename T>
std::string expected_type() {
  if constexpr (std::is_same_v<T, bool>)
    return "a boolean";
  else if constexpr (std::is_integral_v<T>)
    return "an integer";
  else if constexpr (std::is_floating_point_v<T>)
    return "a float";
  else if constexpr (std::is_same_v<T, std::string> || Setting<T>)
    return "a string";
  else if constexpr (std::is_same_v<T, std::vector<double>>)
    return "an array of floats";
  else if constexpr (std::is_same_v<T, std::vector<std::string>>)
    return "an array of strings";
  else
    return "an array of integers";
}

// "string \"fast\"", "float 3.5", "array [ 1, 2 ]": the type and value a user wrote.
std::string describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "string " + schema::toml_quote(node.as_string()->get());
    case toml::node_type::integer:
      return "integer " + std::to_string(node.as_integer()->get());
    case toml::node_type::floating_point:
      return "float " + schema::format_number(node.as_floating_point()->get());
    case toml::node_type::boolean:
      return node.as_boolean()->get() ? "boolean true" : "boolean false";
    case toml::node_type::table:
      return "a table";
    default:
      break;
  }
  std::ostringstream text;
  text << node.type() << ' ';
  node.visit([&](const auto& value) { text << value; });
  std::string out = text.str();
  return out.size() > 60 ? out.substr(0, 57) + "..." : out;
}

template <typename T>
std::string type_error(const toml::node& node) {
  return "expected " + expected_type<T>() + ", got " + describe(node);
}

// read_value: converts one TOML value to a member's type and checks its rule. Returns the problem, or
// "" after storing the value.
std::string read_value(const toml::node& node, const schema::Rule&, bool& out) {
  const auto* value = node.as_boolean();
  if (!value) return type_error<bool>(node);
  out = value->get();
  return "";
}

template <typename Int>
requires(std::is_integral_v<Int> && !std::is_same_v<Int, bool>) std::string
    read_value(const toml::node& node, const schema::Rule& rule, Int& out) {
  const auto* value = node.as_integer();  // a float such as 3.0 is a type error, as documented
  if (!value) return type_error<Int>(node);
  const std::int64_t number = value->get();
  if (std::string problem = schema::check_number(rule, static_cast<double>(number)); !problem.empty()) {
    return problem;
  }
  if (number < std::numeric_limits<Int>::min() || number > std::numeric_limits<Int>::max()) {
    return "must be <= " + std::to_string(std::numeric_limits<Int>::max()) + ", got " +
           std::to_string(number);
  }
  out = static_cast<Int>(number);
  return "";
}

std::string read_value(const toml::node& node, const schema::Rule& rule, double& out) {
  double number = 0;
  if (const auto* value = node.as_floating_point()) {
    number = value->get();
  } else if (const auto* integer = node.as_integer()) {
    number = static_cast<double>(integer->get());
  } else {
    return type_error<double>(node);
  }
  if (std::string problem = schema::check_number(rule, number); !problem.empty()) return problem;
  out = number;
  return "";
}

std::string read_value(const toml::node& node, const schema::Rule& rule, std::string& out) {
  const auto* value = node.as_string();
  if (!value) return type_error<std::string>(node);
  if (std::string problem = schema::check_string(rule, value->get()); !problem.empty()) return problem;
  out = value->get();
  return "";
}

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

std::string section_of(const std::string& dotted) { return dotted.substr(0, dotted.find('.')); }
std::string name_of(const std::string& dotted) { return dotted.substr(dotted.rfind('.') + 1); }

bool is_section(const std::string& name) {
  return std::find(std::begin(schema::kSections), std::end(schema::kSections), name) !=
         std::end(schema::kSections);
}

// The dotted keys of string members: an override of one takes its text verbatim unless quoted.
std::vector<std::string> string_keys() {
  std::vector<std::string> keys;
  Config defaults;
  schema::visit_fields(defaults,
                       [&](const char* section, const char* key, auto& member, const schema::Rule&) {
                         using Member = std::decay_t<decltype(member)>;
                         if constexpr (std::is_same_v<Member, std::string> || Setting<Member>) {
                           keys.push_back(std::string(section) + "." + key);
                         }
                       });
  return keys;
}

struct Problem {
  std::uint32_t line;  // 0 for problems without a file position (--set, cross-key); they sort last
  std::uint32_t column;
  std::size_t sequence;
  std::string text;
};

class Loader {
 public:
  Loader(const std::string& path, Config& config) : path_(path), config_(config), keys_(config_keys()) {}

  void parse_file();
  void apply_override(const std::string& text);
  void check_structure();
  void read_fields() { schema::visit_fields(config_, *this); }
  void check_cross_keys();
  template <typename Fail>
  void check_model_size_keys(const Fail& fail);
  template <typename Fail>
  void check_freeze_keys(const Fail& fail);
  template <typename Fail>
  void check_augment_keys(const Fail& fail);
  template <typename Fail>
  void check_optimizer_and_ema_keys(const Fail& fail);
  bool has_problems() const { return !problems_.empty(); }
  void throw_if_problems();

  // The schema visitor: reads one key, if present, into its member.
  template <typename T>
  void operator()(const char* section, const char* key, T& member, const schema::Rule& rule) {
    const std::string dotted = std::string(section) + "." + key;
    const toml::node* node = root_[section][key].node();
    if (!node) {
      config_.origin[dotted] = schema::kDefaultOrigin;
      return;
    }
    config_.origin[dotted] = where(dotted, *node);
    if constexpr (IsVector<T>::value) {
      read_array(dotted, *node, member, rule);
    } else if constexpr (Setting<T>) {
      read_setting(dotted, *node, member, rule);
    } else if (std::string problem = read_value(*node, rule, member); !problem.empty()) {
      report_value(dotted, *node, problem);
    } else if constexpr (std::is_same_v<T, std::string>) {
      replace_alias(dotted, rule, member);
    }
  }

 private:
  template <typename E>
  void read_array(const std::string& dotted, const toml::node& node, std::vector<E>& member,
                  const schema::Rule& rule);

  // An enumerated setting: its name is checked by the rule (one_of, built from the same table), an old
  // name replaced, then parsed once into the enum.
  template <Setting E>
  void read_setting(const std::string& dotted, const toml::node& node, E& member, const schema::Rule& rule) {
    std::string name;
    if (std::string problem = read_value(node, rule, name); !problem.empty())
      return report_value(dotted, node, problem);
    replace_alias(dotted, rule, name);
    const std::optional<E> value = parse_setting<E>(name);
    if (!value)
      return report_value(dotted, node, "unknown value " + schema::toml_quote(name));  // the rule lists all
    member = *value;
  }

  // An old value (schema::Alias) becomes its new one, with one warning saying where it was written.
  void replace_alias(const std::string& dotted, const schema::Rule& rule, std::string& member) {
    const schema::Alias* alias = schema::find_alias(rule, member);
    if (!alias) return;
    config_.warnings.push_back(config_.origin[dotted] + ": " + dotted + " = " + schema::toml_quote(member) +
                               " is an old name: " + alias->why + "; write " +
                               schema::toml_quote(alias->value));
    member = alias->value;
  }

  std::string position(const toml::source_region& source) const {
    return path_ + ":" + std::to_string(source.begin.line) + ":" + std::to_string(source.begin.column);
  }
  // Where a value came from: its --set argument, else its position in the file.
  std::string where(const std::string& dotted, const toml::node& node) const {
    auto it = overridden_.find(dotted);
    return it != overridden_.end() ? it->second : position(node.source());
  }
  void report(const toml::source_region& source, const std::string& at, const std::string& text) {
    problems_.push_back({source.begin.line, source.begin.column, problems_.size(), at + ": " + text});
  }
  // A problem with the value of `dotted`, or of its element `index`: "where: data.std[1]: problem".
  // An override's problems sort after the file's: they are reported where the --set was given.
  void report_value(const std::string& dotted, const toml::node& node, const std::string& problem,
                    std::optional<std::size_t> index = std::nullopt) {
    const std::string label = dotted + (index ? "[" + std::to_string(*index) + "]" : "") + ": " + problem;
    auto it = overridden_.find(dotted);
    if (it != overridden_.end()) return report(it->second + ": " + label);
    report(node.source(), position(node.source()), label);
  }
  void report(const std::string& text) { problems_.push_back({0, 0, problems_.size(), text}); }

  std::string path_;
  Config& config_;
  std::vector<std::string> keys_;
  toml::table root_;
  std::map<std::string, std::string> overridden_;  // dotted key -> "--set key=value" (the last one)
  std::vector<Problem> problems_;
};

void Loader::parse_file() {
  if (path_.empty()) return;  // no file: defaults and overrides only
  std::error_code error;
  if (std::filesystem::is_directory(path_, error)) {
    throw ConfigError(path_ + ": is a directory, expected a TOML config file");
  }
  std::ifstream in(path_, std::ios::binary);
  if (!in) throw ConfigError(path_ + ": cannot open config file: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  try {
    root_ = toml::parse(text.str(), path_);
  } catch (const toml::parse_error& e) {
    throw ConfigError(position(e.source()) + ": TOML syntax error: " + std::string(e.description()));
  }
}

void Loader::apply_override(const std::string& text) {
  const std::string at = "--set " + text;
  const auto equals = text.find('=');
  if (equals == std::string::npos) {
    return report(at + ": expected section.key=value, e.g. --set train.epochs=3");
  }
  const std::string dotted = trim(text.substr(0, equals));
  const std::string raw = trim(text.substr(equals + 1));
  if (std::find(keys_.begin(), keys_.end(), dotted) == keys_.end()) {
    return report(at + ": unknown key '" + dotted + "'" + schema::suggest_key(dotted, keys_));
  }
  const std::string section = section_of(dotted);
  const std::string key = name_of(dotted);
  root_.insert(section, toml::table{});  // no-op when the file has the section
  toml::table* table = root_[section].as_table();
  if (!table) return report(at + ": cannot set " + dotted + ": '" + section + "' is not a table in " + path_);

  static const std::vector<std::string> kStringKeys = string_keys();
  const bool string_key = std::find(kStringKeys.begin(), kStringKeys.end(), dotted) != kStringKeys.end();
  toml::table parsed;
  try {
    parsed = toml::parse("value = " + raw);
  } catch (const toml::parse_error&) {
    parsed.clear();  // not TOML: taken as a string below
  }
  toml::node* value = parsed.size() == 1 ? parsed.get("value") : nullptr;
  if (value && !(string_key && !value->is_string())) {
    value->visit([&](auto& node) { table->insert_or_assign(key, std::move(node)); });
  } else {
    table->insert_or_assign(key, raw);
  }
  overridden_[dotted] = at;
}

void Loader::check_structure() {
  for (auto&& [name, node] : root_) {
    const std::string section(name.str());
    if (!is_section(section)) {
      if (node.is_table()) {
        report(name.source(), position(name.source()),
               "unknown section '[" + section + "]'" + schema::suggest_section(section));
      } else {
        report(name.source(), position(name.source()),
               "unknown key '" + section + "'" + schema::suggest_key(section, keys_));
      }
      continue;
    }
    const toml::table* table = node.as_table();
    if (!table) {
      report(node.source(), position(node.source()),
             section + ": expected a table (the [" + section + "] section), got " + describe(node));
      continue;
    }
    for (auto&& [key, value] : *table) {
      const std::string dotted = section + "." + std::string(key.str());
      if (std::find(keys_.begin(), keys_.end(), dotted) == keys_.end()) {
        report(key.source(), position(key.source()),
               "unknown key '" + dotted + "'" + schema::suggest_key(dotted, keys_));
      }
    }
  }
}

template <typename E>
void Loader::read_array(const std::string& dotted, const toml::node& node, std::vector<E>& member,
                        const schema::Rule& rule) {
  const toml::array* array = node.as_array();
  if (!array) return report_value(dotted, node, type_error<std::vector<E>>(node));
  if (rule.exact_size && array->size() != rule.exact_size) {
    return report_value(dotted, node,
                        "must have exactly " + std::to_string(rule.exact_size) + " elements, got " +
                            std::to_string(array->size()));
  }
  std::vector<E> values;
  for (std::size_t i = 0; i < array->size(); ++i) {
    const toml::node& element = *array->get(i);
    E value{};
    std::string problem = read_value(element, rule, value);
    if constexpr (std::is_arithmetic_v<E>) {
      if (problem.empty() && rule.strictly_increasing && !values.empty() && !(value > values.back())) {
        problem = "must be greater than the element before it (" + schema::format_number(values.back()) +
                  "), got " + schema::format_number(value);
      }
    }
    if (!problem.empty()) return report_value(dotted, element, problem, i);
    values.push_back(value);
  }
  member = std::move(values);
}

// A size key changed for a model it does not size would be ignored: a run that silently trains
// another model than the config describes. Each key names the models it applies to. (Keys at their
// defaults pass: the resolved TOML of `trainer config --format toml` writes every key.)
template <typename Fail>
void Loader::check_model_size_keys(const Fail& fail) {
  const ModelConfig& m = config_.model;
  const ModelConfig defaults;
  const std::string& name = m.name;
  const bool vit = name == "vit", resnet = name.starts_with("resnet"),
             convnext = name.starts_with("convnext");
  const char* const fixed_vit = "'vit' (vit_b_16 and vit_s_16 have fixed sizes)";
  const char* const convnexts = "'convnext' and 'convnext_tiny'";
  struct SizeKey {
    const char* key;
    bool changed, applies;
    const char* models;
  };
  const SizeKey keys[] = {
      {"model.patch_size", m.patch_size != defaults.patch_size, vit, fixed_vit},
      {"model.depth", m.depth != defaults.depth, vit, fixed_vit},
      {"model.heads", m.heads != defaults.heads, vit, fixed_vit},
      {"model.mlp_dim", m.mlp_dim != defaults.mlp_dim, vit, fixed_vit},
      {"model.width", m.width != defaults.width, vit || resnet, "'vit' and the ResNets"},
      {"model.depths", m.depths != defaults.depths, convnext, convnexts},
      {"model.widths", m.widths != defaults.widths, convnext, convnexts},
      {"model.stem_patch", m.stem_patch != defaults.stem_patch, convnext, convnexts},
      {"model.drop_path", m.drop_path != defaults.drop_path, convnext, convnexts},
      {"model.layer_scale", m.layer_scale != defaults.layer_scale, convnext, convnexts},
  };
  for (const SizeKey& k : keys)
    if (k.changed && !k.applies)
      fail(k.key, "sizes model " + std::string(k.models) + ", not '" + name +
                      "'. HINT: remove it, or set model.name to one of those");
}

// model.freeze_epochs says when model.freeze ends, so it needs one; ZeRO's shards are laid out once over
// the parameters that train, which a freeze changes (app/run/freeze.h checks the prefixes themselves).
template <typename Fail>
void Loader::check_freeze_keys(const Fail& fail) {
  const ModelConfig& m = config_.model;
  if (m.freeze.empty() && m.freeze_epochs != 0)
    fail("model.freeze_epochs",
         "has nothing to end: model.freeze is empty. HINT: set model.freeze (e.g. "
         "[\"backbone\"]) or remove model.freeze_epochs");
  if (!m.freeze.empty() && config_.dist.zero_stage > 0)
    fail("dist.zero_stage",
         "ZeRO shards the parameters that train once, but model.freeze changes which "
         "do. HINT: set dist.zero_stage = 0 to fine-tune with frozen layers");
}

// The [augment] rules that tie keys together: a RandAugment bin within the bins, hue within half a turn,
// and [min, max] ranges in order.
template <typename Fail>
void Loader::check_augment_keys(const Fail& fail) {
  const AugmentSection& a = config_.augment;
  if (a.randaugment_magnitude >= a.magnitude_bins) {
    fail("augment.randaugment_magnitude", "must be < augment.magnitude_bins (" +
                                              std::to_string(a.magnitude_bins) + "), got " +
                                              std::to_string(a.randaugment_magnitude));
  }
  if (!a.color_jitter.empty() && a.color_jitter.size() != 4) {
    fail("augment.color_jitter", "must be [] (off) or [brightness, contrast, saturation, hue], got " +
                                     std::to_string(a.color_jitter.size()) + " values");
  } else if (!a.color_jitter.empty() && a.color_jitter[3] > 0.5) {
    fail("augment.color_jitter",
         "hue (the 4th value) must be <= 0.5, got " + schema::format_number(a.color_jitter[3]));
  }
  for (const auto& [key, range] : {std::pair{"augment.erasing_scale", a.erasing_scale},
                                   std::pair{"augment.erasing_ratio", a.erasing_ratio}}) {
    if (range[0] > range[1]) {
      fail(key, "must be [min, max] with min <= max, got [" + schema::format_number(range[0]) + ", " +
                    schema::format_number(range[1]) + "]");
    }
  }
}

// LAMB and LARS need each parameter's whole norm, which a ZeRO shard does not hold; keep_best can only
// rank the average's accuracy when there is an average.
template <typename Fail>
void Loader::check_optimizer_and_ema_keys(const Fail& fail) {
  const OptimizerKind name = config_.optim.name;
  if ((name == OptimizerKind::lamb || name == OptimizerKind::lars) && config_.dist.zero_stage > 0)
    fail("dist.zero_stage", "ZeRO shards parameters, but optim.name = \"" + setting_name(name) +
                                "\" needs each parameter's whole norm (its trust ratio). HINT: set "
                                "dist.zero_stage = 0, or use sgd or adamw");
  if (config_.checkpoint.keep_best_on == KeepBestOn::ema && !config_.ema.active())
    fail("checkpoint.keep_best_on",
         "\"ema\" ranks the weight average's accuracy, but there is none. "
         "HINT: set ema.enabled = true (and ema.decay > 0)");
  if (config_.ema.min_decay > config_.ema.decay)
    fail("ema.min_decay", "must not exceed ema.decay (" + schema::format_number(config_.ema.decay) +
                              "), got " + schema::format_number(config_.ema.min_decay));
}

void Loader::check_cross_keys() {
  const auto set_by_user = [&](const std::string& key) {
    return config_.origin.at(key) != schema::kDefaultOrigin;
  };
  const auto fail = [&](const std::string& key, const std::string& message) {
    report(config_error_at(config_, key, message).what());
  };
  const DataConfig& data = config_.data;
  if (data.normalize_std.size() != data.normalize_mean.size()) {
    const std::string mean_size = std::to_string(data.normalize_mean.size());
    if (set_by_user("data.normalize_std")) {
      fail("data.normalize_std", "must have as many elements as data.normalize_mean (" + mean_size +
                                     "), got " + std::to_string(data.normalize_std.size()));
    } else {
      fail("data.normalize_mean",
           "has " + mean_size + " elements but data.normalize_std is not set; set both or neither");
    }
  }
  if (config_.optim.nesterov && config_.optim.momentum <= 0) {
    fail("optim.nesterov", "true requires optim.momentum > 0, got optim.momentum = " +
                               schema::format_number(config_.optim.momentum));
  }
  if (config_.schedule.name == ScheduleKind::multistep && config_.schedule.milestones.empty()) {
    fail(set_by_user("schedule.milestones") ? "schedule.milestones" : "schedule.name",
         "schedule \"multistep\" needs schedule.milestones, e.g. [30, 60, 80]");
  }
  check_model_size_keys(fail);
  check_freeze_keys(fail);
  check_augment_keys(fail);
  check_optimizer_and_ema_keys(fail);
}

void Loader::throw_if_problems() {
  if (problems_.empty()) return;
  // File order first, as an editor shows them; then --set and cross-key problems as found.
  std::sort(problems_.begin(), problems_.end(), [](const Problem& a, const Problem& b) {
    auto rank = [](const Problem& p) { return std::tuple(p.line == 0, p.line, p.column, p.sequence); };
    return rank(a) < rank(b);
  });
  std::string message;
  for (const auto& problem : problems_) message += (message.empty() ? "" : "\n") + problem.text;
  throw ConfigError(message);
}

}  // namespace

bool Config::operator==(const Config& other) const {
  return model == other.model && data == other.data && augment == other.augment && train == other.train &&
         optim == other.optim && schedule == other.schedule && dist == other.dist &&
         checkpoint == other.checkpoint && metrics == other.metrics && mixup == other.mixup &&
         ema == other.ema;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config config;
  config.source_path = path;
  Loader loader(path, config);
  loader.parse_file();
  for (const auto& text : overrides) loader.apply_override(text);
  loader.check_structure();
  loader.read_fields();
  // Cross-key rules read the members, which are only trustworthy once every key has passed.
  if (!loader.has_problems()) loader.check_cross_keys();
  loader.throw_if_problems();
  return config;
}

ConfigError config_error_at(const Config& config, const std::string& dotted_key, const std::string& message) {
  auto it = config.origin.find(dotted_key);
  std::string at;
  if (it != config.origin.end() && it->second != schema::kDefaultOrigin) {
    at = it->second;
  } else {
    // Not written anywhere: name the file all the same, so the user knows where to add the key.
    at = config.source_path.empty() ? schema::kDefaultOrigin
                                    : config.source_path + " " + schema::kDefaultOrigin;
  }
  return ConfigError(at + ": " + dotted_key + ": " + message);
}

}  // namespace trainer
