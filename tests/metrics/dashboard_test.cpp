// The Grafana dashboard refers only to series the exporter really exports (the list comes from the
// exporter's code), has the panels the project promises, and is portable (data source by variable).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>

#include "metrics/dashboard_util.h"
#include "metrics/exporter.h"

namespace trainer {
namespace {

using testing::load_dashboard;
using testing::promql_refs;

std::set<std::string> exported_names() {
  const std::vector<std::string> v = Exporter::exported_series_names();
  return {v.begin(), v.end()};
}

// The exporter's labels and the ones Prometheus adds when it scrapes.
std::set<std::string> exported_labels() {
  const std::vector<std::string> v = Exporter::exported_label_names();
  std::set<std::string> labels(v.begin(), v.end());
  labels.insert({"job", "instance"});
  return labels;
}

// The series queries may use: the exporter's and Prometheus' own `up` (for the "ranks up" panel).
std::set<std::string> queryable_names() {
  std::set<std::string> names = exported_names();
  names.insert("up");
  return names;
}

// How often `needle` occurs in `text`.
std::size_t count_of(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The dashboard's panel and annotation queries.
std::vector<testing::DashboardQuery> all_queries(const nlohmann::json& d) {
  std::vector<testing::DashboardQuery> q = testing::dashboard_queries(d);
  for (const auto& a : testing::annotation_queries(d)) q.push_back(a);
  return q;
}

TEST(PromqlScanner, FindsMetricsAndLabels) {
  const auto r = promql_refs(
      R"(histogram_quantile(0.9, sum by (rank, le) (rate(a_bucket{host=~"$host", phase="x|y"}[$__rate_interval]))))"
      R"( / on(rank) group_left max without (kind) (b) + count(c offset 5m) * 1e-3 > bool 2 and d)");
  EXPECT_EQ(r.metrics, (std::set<std::string>{"a_bucket", "b", "c", "d"}));
  EXPECT_EQ(r.labels, (std::set<std::string>{"rank", "le", "host", "phase", "kind"}));
  EXPECT_EQ(promql_refs(R"(sum(rate(x_total[1m])) by (rank))").labels, std::set<std::string>{"rank"});
  EXPECT_EQ(testing::variable_refs(R"(label_values(m{host=~"$host"}, rank))").metrics,
            std::set<std::string>{"m"});
  EXPECT_EQ(testing::substitute_variables(R"(rate(x{rank=~"$rank"}[$__rate_interval]))"),
            R"(rate(x{rank=~".*"}[10s]))");
}

TEST(Dashboard, EveryQueryUsesOnlyExportedMetricsAndLabels) {
  const auto d = load_dashboard();
  const auto queries = all_queries(d);
  ASSERT_GE(queries.size(), 20u);
  const std::set<std::string> names = queryable_names();
  const std::set<std::string> labels = exported_labels();
  for (const auto& q : queries) {
    SCOPED_TRACE(q.panel + " / " + q.ref + ": " + q.expr);
    const auto r = promql_refs(q.expr);
    EXPECT_FALSE(r.metrics.empty());
    for (const auto& m : r.metrics) EXPECT_TRUE(names.count(m)) << "not exported: " << m;
    for (const auto& l : r.labels) EXPECT_TRUE(labels.count(l)) << "no such label: " << l;
    // Every selector of a trainer series follows every variable, so that selecting a job, instance,
    // run, host or rank filters every panel, and two runs on one host never mix in one.
    const std::size_t selectors =
        count_of(q.expr, "{") - count_of(q.expr, "{job=~\"$job\", instance=~\"$instance\"}");
    for (const char* matcher : {R"(job=~"$job")", R"(instance=~"$instance")"})
      EXPECT_GE(count_of(q.expr, matcher), selectors) << matcher;
    for (const char* matcher : {R"(run=~"$run")", R"(host=~"$host")", R"(rank=~"$rank")"})
      EXPECT_EQ(count_of(q.expr, matcher), selectors) << matcher;
    // Aggregations that keep per-rank or per-run series keep the run apart.
    for (const char* grouping : {"by (rank", "by (phase", "by (kind"})
      EXPECT_EQ(count_of(q.expr, grouping), 0u) << grouping << ": group by run first";
  }
  for (const auto& v : testing::variable_queries(d)) {
    SCOPED_TRACE(v);
    const auto r = testing::variable_refs(v);
    for (const auto& m : r.metrics) EXPECT_TRUE(names.count(m)) << "not exported: " << m;
    for (const auto& l : r.labels) EXPECT_TRUE(labels.count(l)) << "no such label: " << l;
  }
}

TEST(Dashboard, ShowsEveryExportedMetric) {
  std::set<std::string> used;
  for (const auto& q : all_queries(load_dashboard()))
    for (const auto& m : promql_refs(q.expr).metrics) used.insert(m);
  for (const auto& name : exported_names()) {
    if (name.ends_with("_bucket") || name.ends_with("_count")) continue;  // the _sum stands for its histogram
    EXPECT_TRUE(used.count(name)) << name << " is exported but on no panel";
  }
}

TEST(Dashboard, HasThePromisedPanels) {
  const auto d = load_dashboard();
  std::vector<std::string> titles;
  for (const auto& p : d.at("panels")) titles.push_back(p.value("title", ""));
  for (const char* wanted :
       {"Step time breakdown", "p90 step time per rank", "Throughput: total and per rank", "Straggler",
        "Exposed all-reduce share", "Data-wait share", "Loss", "Learning rate", "Loss scale", "Device memory",
        "Eval accuracy", "Skipped steps", "Bad samples", "GPU utilisation per rank", "Ranks up",
        "Process CPU", "Process resident memory", "Open file descriptors"}) {
    EXPECT_TRUE(std::any_of(titles.begin(), titles.end(),
                            [&](const std::string& t) { return t.rfind(wanted, 0) == 0; }))
        << "no panel titled " << wanted << "...";
  }
  // The breakdown is stacked and repeated per rank; it stacks every part of the step (the counters of
  // trainer_step_phase_seconds_total partition it), divided by the steps taken.
  for (const auto& p : d.at("panels")) {
    if (p.value("title", "").rfind("Step time breakdown", 0) != 0) continue;
    EXPECT_EQ(p.value("repeat", ""), "rank");
    EXPECT_EQ(p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"], "normal");
    const std::string expr = p["targets"][0]["expr"];
    EXPECT_NE(expr.find("trainer_step_phase_seconds_total"), std::string::npos);
    EXPECT_NE(expr.find("trainer_step_seconds_count"), std::string::npos);
    EXPECT_EQ(expr.find("phase="), std::string::npos) << "every part is stacked";
  }
}

TEST(Dashboard, DataSourceIsAVariableAndHostAndRankAreVariables) {
  const auto d = load_dashboard();
  std::map<std::string, std::string> vars;
  for (const auto& v : d.at("templating").at("list")) vars[v.at("name")] = v.at("type");
  EXPECT_EQ(vars["datasource"], "datasource");
  for (const char* name : {"job", "instance", "run", "host", "rank"}) EXPECT_EQ(vars[name], "query") << name;
  // Annotations mark epoch ends and checkpoints.
  std::set<std::string> annotations;
  for (const auto& a : testing::annotation_queries(d)) annotations.insert(a.panel);
  EXPECT_EQ(annotations, (std::set<std::string>{"Epoch ends", "Checkpoints"}));
  // No hard-coded data source uid anywhere: every "datasource" object says ${datasource}.
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& j) {
    if (j.is_object()) {
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (it.key() == "datasource" && it.value().is_object()) {
          EXPECT_EQ(it.value().value("uid", ""), "${datasource}") << it.value().dump();
        }
        walk(it.value());
      }
    } else if (j.is_array()) {
      for (const auto& x : j) walk(x);
    }
  };
  walk(d);
}

TEST(Dashboard, ProvisioningAndScrapeConfigFitTogether) {
  const std::string root = TRAINER_SOURCE_DIR;
  const std::string ds =
      testing::read_text(root + "/configs/grafana/provisioning/datasources/prometheus.yaml");
  EXPECT_NE(ds.find("type: prometheus"), std::string::npos);
  const std::string dash = testing::read_text(root + "/configs/grafana/provisioning/dashboards/trainer.yaml");
  EXPECT_NE(dash.find("type: file"), std::string::npos);
  EXPECT_NE(dash.find("path: "), std::string::npos);
  const std::string prom = root + "/configs/prometheus/prometheus.yml";
  const std::string scrape = testing::read_text(prom);
  // 9464-9471: clear of dcgm-exporter's 9400 on a GPU host.
  for (int port = 9464; port <= 9471; ++port)
    EXPECT_NE(scrape.find("localhost:" + std::to_string(port)), std::string::npos) << port;
  if (std::system("command -v promtool >/dev/null 2>&1") == 0) {
    const std::string cmd = "promtool check config " + prom + " >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
}

}  // namespace
}  // namespace trainer
