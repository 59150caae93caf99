#pragma once
// Reading the Grafana dashboard: every PromQL query in it, the metric and label names a query refers to,
// and the substitution of Grafana's variables for running a query against Prometheus directly.
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer::testing {

inline std::string dashboard_path() {
  return std::string(TRAINER_SOURCE_DIR) + "/configs/grafana/dashboards/trainer.json";
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline nlohmann::json load_dashboard() { return nlohmann::json::parse(read_text(dashboard_path())); }

struct DashboardQuery {
  std::string panel;  // panel title
  std::string ref;    // refId
  std::string expr;
};

// The targets of every panel, rows' nested panels included.
inline void collect_queries(const nlohmann::json& panels, std::vector<DashboardQuery>& out) {
  for (const auto& p : panels) {
    if (p.contains("targets"))
      for (const auto& t : p["targets"])
        if (t.contains("expr"))
          out.push_back({p.value("title", ""), t.value("refId", ""), t["expr"].get<std::string>()});
    if (p.contains("panels")) collect_queries(p["panels"], out);
  }
}

inline std::vector<DashboardQuery> dashboard_queries(const nlohmann::json& d) {
  std::vector<DashboardQuery> out;
  collect_queries(d.at("panels"), out);
  return out;
}

// The dashboard's annotation queries (epoch ends, checkpoints), as DashboardQuery with the annotation's
// name as panel.
inline std::vector<DashboardQuery> annotation_queries(const nlohmann::json& d) {
  std::vector<DashboardQuery> out;
  if (d.contains("annotations"))
    for (const auto& a : d["annotations"].value("list", nlohmann::json::array()))
      if (a.contains("expr"))
        out.push_back({a.value("name", ""), "annotation", a["expr"].get<std::string>()});
  return out;
}

// The queries of the dashboard's "query" variables (Grafana's label_values(...) syntax).
inline std::vector<std::string> variable_queries(const nlohmann::json& d) {
  std::vector<std::string> out;
  for (const auto& v : d.at("templating").at("list")) {
    if (v.value("type", "") != "query") continue;
    const auto& q = v.at("query");
    out.push_back(q.is_string() ? q.get<std::string>() : q.at("query").get<std::string>());
  }
  return out;
}

struct PromqlRefs {
  std::set<std::string> metrics;
  std::set<std::string> labels;  // in matchers and in by/without/on/ignoring/group_x lists
};

inline bool ident_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
}
inline bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }

// A small PromQL scanner: strings, durations, numbers, functions, aggregations and keywords are skipped;
// what remains as a bare identifier is a metric name.
inline PromqlRefs promql_refs(const std::string& e) {
  static const std::set<std::string> aggregations = {"sum",          "min",     "max",    "avg",
                                                     "group",        "stddev",  "stdvar", "count",
                                                     "count_values", "bottomk", "topk",   "quantile"};
  static const std::set<std::string> grouping = {"by",       "without",    "on",
                                                 "ignoring", "group_left", "group_right"};
  static const std::set<std::string> keywords = {"and",    "or",    "unless", "bool",
                                                 "offset", "atan2", "inf",    "nan"};
  PromqlRefs r;
  std::size_t i = 0;
  const std::size_t n = e.size();
  auto skip_space = [&](std::size_t j) {
    while (j < n && std::isspace(static_cast<unsigned char>(e[j]))) ++j;
    return j;
  };
  auto skip_string = [&](std::size_t j) {  // e[j] is the opening quote
    const char q = e[j++];
    while (j < n && e[j] != q) j += (e[j] == '\\' && q != '`') ? 2 : 1;
    if (j >= n) throw std::runtime_error("unterminated string in: " + e);
    return j + 1;
  };
  auto read_ident = [&](std::size_t& j) {
    const std::size_t start = j;
    while (j < n && ident_char(e[j])) ++j;
    return e.substr(start, j - start);
  };
  while (i < n) {
    const char c = e[i];
    if (c == '"' || c == '\'' || c == '`') {
      i = skip_string(i);
    } else if (c == '{') {  // label matchers: name op "value", ...
      ++i;
      while (i < n && e[i] != '}') {
        if (e[i] == '"' || e[i] == '\'' || e[i] == '`')
          i = skip_string(i);
        else if (ident_start(e[i]))
          r.labels.insert(read_ident(i));
        else
          ++i;
      }
      ++i;
    } else if (c == '[') {
      while (i < n && e[i] != ']') ++i;
      ++i;
    } else if (c == '$') {  // a Grafana variable outside a string or range
      ++i;
      if (i < n && e[i] == '{') {
        while (i < n && e[i] != '}') ++i;
        ++i;
      } else {
        read_ident(i);
      }
    } else if (std::isdigit(static_cast<unsigned char>(c)) ||
               (c == '.' && i + 1 < n && std::isdigit(e[i + 1]))) {
      while (i < n && (std::isalnum(static_cast<unsigned char>(e[i])) || e[i] == '.' ||
                       ((e[i] == '-' || e[i] == '+') && (e[i - 1] == 'e' || e[i - 1] == 'E'))))
        ++i;
    } else if (ident_start(c)) {
      const std::string id = read_ident(i);
      const std::size_t next = skip_space(i);
      const bool call = next < n && e[next] == '(';
      if (grouping.count(id)) {
        if (call) {
          i = next + 1;
          while (i < n && e[i] != ')') {
            if (ident_start(e[i]))
              r.labels.insert(read_ident(i));
            else
              ++i;
          }
          ++i;
        }
      } else if (aggregations.count(id) || keywords.count(id) || call) {
        // function, aggregation or keyword
      } else {
        r.metrics.insert(id);
      }
    } else {
      ++i;
    }
  }
  return r;
}

// label_values(metric{matchers}, label) or label_values(label).
inline PromqlRefs variable_refs(const std::string& q) {
  static const std::regex two(R"(^\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$)");
  static const std::regex one(R"(^\s*label_values\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$)");
  std::smatch m;
  PromqlRefs r;
  if (std::regex_match(q, m, two)) {
    r = promql_refs(m[1].str());
    r.labels.insert(m[2].str());
  } else if (std::regex_match(q, m, one)) {
    r.labels.insert(m[1].str());
  } else {
    throw std::runtime_error("unsupported variable query: " + q);
  }
  return r;
}

// What Grafana would send for "All" selected: multi-value variables become the regex .*, and the rate
// interval a window long enough for several 1 s scrapes. `rank` and `run` select as the rank and run
// variables would.
inline std::string substitute_variables(std::string e, const std::string& rate_interval = "10s",
                                        const std::string& rank = ".*", const std::string& run = ".*") {
  const std::pair<std::string, std::string> subs[] = {{"$__rate_interval", rate_interval},
                                                      {"$__interval", rate_interval},
                                                      {"$__range", "1m"},
                                                      {"${job}", ".*"},
                                                      {"${instance}", ".*"},
                                                      {"${run}", run},
                                                      {"${host}", ".*"},
                                                      {"${rank}", rank},
                                                      {"$job", ".*"},
                                                      {"$instance", ".*"},
                                                      {"$run", run},
                                                      {"$host", ".*"},
                                                      {"$rank", rank}};
  for (const auto& [from, to] : subs)
    for (std::size_t pos; (pos = e.find(from)) != std::string::npos;) e.replace(pos, from.size(), to);
  return e;
}

}  // namespace trainer::testing
