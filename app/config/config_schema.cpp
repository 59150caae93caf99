#include "app/config/config_schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <utility>

namespace trainer::config_schema {

Rule one_of(std::vector<std::string> allowed) {
  Rule rule;
  rule.one_of = std::move(allowed);
  return rule;
}

Rule at_least(double min) {
  Rule rule;
  rule.min = min;
  return rule;
}

Rule greater_than(double min) {
  Rule rule = at_least(min);
  rule.min_exclusive = true;
  return rule;
}

Rule closed(double min, double max) {
  Rule rule = at_least(min);
  rule.max = max;
  return rule;
}

Rule half_open(double min, double max) {
  Rule rule = closed(min, max);
  rule.max_exclusive = true;
  return rule;
}

Rule open_closed(double min, double max) {
  Rule rule = closed(min, max);
  rule.min_exclusive = true;
  return rule;
}

Rule or_special(Rule rule, double value, std::string meaning) {
  rule.special = value;
  rule.special_meaning = std::move(meaning);
  return rule;
}

Rule exactly(std::size_t size, Rule element) {
  element.exact_size = size;
  return element;
}

Rule increasing(Rule element) {
  element.strictly_increasing = true;
  return element;
}

namespace {

// "[0, 1)", ">= 1", "> 0": the allowed range in the notation users know from the docs.
std::string describe_range(const Rule& rule) {
  if (rule.min && rule.max) {
    return std::string(rule.min_exclusive ? "(" : "[") + format_number(*rule.min) + ", " +
           format_number(*rule.max) + (rule.max_exclusive ? ")" : "]");
  }
  if (rule.min) return std::string(rule.min_exclusive ? "> " : ">= ") + format_number(*rule.min);
  if (rule.max) return std::string(rule.max_exclusive ? "< " : "<= ") + format_number(*rule.max);
  return "any number";
}

bool in_range(const Rule& rule, double value) {
  if (rule.min && (rule.min_exclusive ? value <= *rule.min : value < *rule.min)) return false;
  if (rule.max && (rule.max_exclusive ? value >= *rule.max : value > *rule.max)) return false;
  return true;
}

}  // namespace

std::string check_number(const Rule& rule, double value) {
  // TOML allows inf and nan; no setting of ours means anything with them.
  if (!std::isfinite(value)) return "must be a finite number, got " + format_number(value);
  if (in_range(rule, value) || (rule.special && value == *rule.special)) return "";
  std::string range = describe_range(rule);
  const bool interval = rule.min && rule.max;
  std::string allowed = interval ? "must be in " + range : "must be " + range;
  if (rule.special) {
    allowed = "must be " + format_number(*rule.special) + " (" + rule.special_meaning + ") or " +
              (interval ? "in " : "") + range;
  }
  return allowed + ", got " + format_number(value);
}

Rule with_alias(Rule rule, Alias alias) {
  rule.aliases.push_back(std::move(alias));
  return rule;
}

const Alias* find_alias(const Rule& rule, const std::string& value) {
  for (const Alias& alias : rule.aliases)
    if (alias.old_value == value) return &alias;
  return nullptr;
}

std::string check_string(const Rule& rule, const std::string& value) {
  if (rule.one_of.empty() || std::find(rule.one_of.begin(), rule.one_of.end(), value) != rule.one_of.end() ||
      find_alias(rule, value)) {
    return "";
  }
  std::string message = "must be one of ";
  for (std::size_t i = 0; i < rule.one_of.size(); ++i) {
    message += (i ? ", " : "") + toml_quote(rule.one_of[i]);
  }
  message += "; got " + toml_quote(value);
  std::string suggestion = closest(value, rule.one_of);
  if (!suggestion.empty()) message += " (did you mean " + toml_quote(suggestion) + "?)";
  return message;
}

std::string format_number(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

std::string toml_float(double value) {
  std::string text = format_number(value);
  // to_chars writes 1.0 as "1": TOML would read that back as an integer.
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

std::string toml_quote(const std::string& text) {
  std::string out = "\"";
  for (unsigned char ch : text) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", ch);
          out += escaped;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_distance = 0;
  for (const auto& candidate : candidates) {
    std::size_t distance = edit_distance(word, candidate);
    if (best.empty() || distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  // A third of the word may be wrong (at least 2 edits): "lrr" -> "lr", "resnet" -> "resnet18", but
  // no wild guesses for words that merely share a length.
  std::size_t allowed = std::max<std::size_t>(2, word.size() / 3);
  if (best_distance <= allowed && best_distance < std::max(word.size(), best.size())) return best;
  // Long and short spellings of one word ("optimizer" for "optim", "sched" for "schedule").
  for (const auto& candidate : candidates) {
    const std::size_t shorter = std::min(word.size(), candidate.size());
    if (shorter >= 3 && word.compare(0, shorter, candidate, 0, shorter) == 0) return candidate;
  }
  return "";
}

namespace {
std::string key_name(const std::string& dotted) { return dotted.substr(dotted.rfind('.') + 1); }
}  // namespace

// The same key in another section wins over spelling: a user who writes train.lr means optim.lr.
std::string suggest_key(const std::string& dotted, const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    if (key_name(key) == key_name(dotted) && key != dotted) return " (did you mean '" + key + "'?)";
  }
  std::string best = closest(dotted, keys);
  if (!best.empty()) return " (did you mean '" + best + "'?)";
  return "; see configs/reference.toml for every key";
}

std::string suggest_section(const std::string& name) {
  std::vector<std::string> sections(std::begin(kSections), std::end(kSections));
  std::string best = closest(name, sections);
  if (!best.empty()) return " (did you mean '[" + best + "]'?)";
  std::string all;
  for (const auto& section : sections) all += (all.empty() ? "[" : ", [") + section + "]";
  return "; sections are " + all;
}

}  // namespace trainer::config_schema
