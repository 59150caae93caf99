// The Grafana dashboard and the alerting rules against a real Prometheus server scraping two concurrent
// 2-rank CPU training runs on this host: every panel and annotation query returns series, each rank
// appears in each of them (selected alone through the rank variable, and by its label where the query
// keeps it), each run selected alone through the run variable shows only itself, every alerting rule
// evaluates without error (none fires), and each rank's /metrics passes `promtool check metrics`.
// Skipped when the `prometheus` binary is absent. No timing asserts: every wait polls
// against a generous deadline, so a loaded machine only makes it slower.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "app/trainer_ranks.h"
#include "metrics/command.h"
#include "metrics/dashboard_util.h"
#include "metrics/prometheus_server.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Two consecutive free ports, reserved (tests/test_ports.h): the ranks' exporters listen on
// metrics.port + LOCAL_RANK.
int free_port_pair() { return testing::reserve_port(2); }

// A tiny model on synthetic data, far more steps than the test needs: the test stops the ranks once
// Prometheus has what it needs, so how fast this machine trains does not matter.
const char* kConfig =
    "[model]\nname = \"mlp\"\nin_channels = 1\n"
    "[data]\ndataset = \"synthetic\"\nsynthetic_samples = 512\nsynthetic_image_size = 12\nbatch_size = 16\n"
    "[train]\ndevice = \"cpu\"\nepochs = 100000\nmax_steps = 10000000\nlog_every_steps = 100000\n"
    "eval_every_epochs = 0\n"
    "[checkpoint]\nevery_epochs = 0\nevery_steps = 40\nsave_final = false\non_signal = false\n";

// The values of `label` in the series of a query's result ("" for a series without it).
std::multiset<std::string> label_values(const json& response, const std::string& label) {
  std::multiset<std::string> values;
  for (const auto& s : response["data"]["result"]) values.insert(s["metric"].value(label, ""));
  return values;
}
std::multiset<std::string> ranks_in(const json& response) { return label_values(response, "rank"); }

class DashboardOnPrometheus : public ::testing::Test {
 protected:
  void SetUp() override {
    prometheus_ = testing::find_executable("prometheus");
    if (prometheus_.empty())
      GTEST_SKIP() << "no prometheus binary (Debian package `prometheus`, scripts/install-deps.sh)";
    dir_ = fs::temp_directory_path() / ("trainer_dash_prom_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }

  std::string prometheus_;
  fs::path dir_;
};

TEST_F(DashboardOnPrometheus, EveryQueryReturnsSeriesForBothRanksOfEachOfTwoRuns) {
  const auto deadline = Clock::now() + std::chrono::seconds(150);
  const std::string rate_window = "5s";  // Grafana's $__rate_interval here: 20 scrapes at 250 ms
  const std::vector<std::string> runs = {"run-a", "run-b"};  // the run directories' names: the run labels
  std::vector<int> ports;
  std::vector<std::unique_ptr<testing::TrainerRanks>> jobs;
  for (const std::string& run : runs) {
    const int metrics_port = free_port_pair();
    ports.insert(ports.end(), {metrics_port, metrics_port + 1});
    const fs::path cfg = dir_ / (run + ".toml");
    std::ofstream(cfg) << kConfig << "[metrics]\nport = " << metrics_port << "\nhost_label = \"ci-host\"\n";
  }
  const std::string rules = std::string(TRAINER_SOURCE_DIR) + "/configs/prometheus/trainer_rules.yml";
  testing::PrometheusServer prom(prometheus_, ports, "250ms", {rules});
  ASSERT_TRUE(prom.started()) << "cannot start " << prometheus_;
  for (const std::string& run : runs) {
    const fs::path out = dir_ / (run + "_out");  // the ranks' console output
    fs::create_directories(out);
    jobs.push_back(std::make_unique<testing::TrainerRanks>(
        2,
        std::vector<std::string>{"train", (dir_ / (run + ".toml")).string(), "--set",
                                 "train.run_dir=" + (dir_ / run).string()},
        out));
  }
  const auto outputs = [&] {
    std::string out;
    for (const auto& j : jobs) out += j->outputs();
    return out;
  };

  // Wait until every rank of both runs has been scraped often enough for every rate() window, with the
  // last scrape a success (a failed one marks the series stale, hiding gauges from instant queries), and
  // has taken part in two checkpoints and two epoch ends (the annotations' events) with at least one of
  // each seen happening between scrapes (a fast run can finish both before its first scrape, and then
  // the annotations' changes() see nothing), and fix that moment:
  // every query is then evaluated at it, so it does not matter when the ranks are stopped.
  const std::string window = "[" + rate_window + "]";
  const std::string ready_query = "count_over_time(trainer_steps_total" + window +
                                  ") >= 6 and increase(trainer_steps_total" + window +
                                  ") > 0 and on (instance) up == 1 and on (instance) "
                                  "trainer_checkpoints_total >= 2 and on (instance) "
                                  "trainer_epochs_completed_total >= 2 and on (instance) "
                                  "changes(trainer_checkpoints_total[30m]) > 0 and on (instance) "
                                  "changes(trainer_epochs_completed_total[30m]) > 0";
  const std::multiset<std::string> all_ranks_of_both = {"0", "0", "1", "1"};
  std::string at;
  json last;
  while (at.empty() && Clock::now() < deadline) {
    for (const auto& j : jobs)
      for (int r = 0; r < j->size(); ++r)
        ASSERT_TRUE(j->rank(r).running()) << "a rank ended early\n" << outputs();
    ASSERT_TRUE(prom.running()) << "prometheus exited:\n" << prom.log();
    last = prom.query(ready_query);
    if (last.is_object() && last.value("status", "") == "success" && ranks_in(last) == all_ranks_of_both) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3f", last["data"]["result"][0]["value"][0].get<double>());
      at = buf;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }
  ASSERT_FALSE(at.empty()) << "the ranks not scraped enough before the deadline; last answer: " << last.dump()
                           << "\nprometheus log:\n"
                           << prom.log() << outputs();
  // The trainer's own /metrics passes promtool's format and naming lint too.
  if (const std::string promtool = testing::find_executable("promtool"); !promtool.empty()) {
    for (std::size_t i = 0; i < ports.size(); ++i) {
      const testing::HttpResponse scrape = testing::http_get(ports[i], "/metrics");
      ASSERT_EQ(scrape.status, 200) << "port " << ports[i];
      const fs::path path = dir_ / ("metrics" + std::to_string(i) + ".txt");
      std::ofstream(path) << scrape.body;
      const testing::CommandResult c = testing::run_command(promtool + " check metrics < " + path.string());
      EXPECT_EQ(c.exit_code, 0) << "port " << ports[i] << ": " << c.output;
    }
  }
  // The alerting rules were evaluated against the live series without an error.
  const json rule_groups = prom.get("/api/v1/rules");
  int evaluated = 0;
  for (const auto& group : rule_groups["data"]["groups"])
    for (const auto& rule : group["rules"]) {
      EXPECT_EQ(rule.value("health", ""), "ok") << rule.dump();
      evaluated += rule.value("health", "") == "ok";
    }
  EXPECT_EQ(evaluated, 3) << rule_groups.dump();
  for (const auto& j : jobs)
    for (int r = 0; r < j->size(); ++r) j->rank(r).signal(SIGTERM);  // done with training

  auto query = [&](const std::string& expr) {
    const json r = prom.query(expr, at);
    EXPECT_TRUE(r.is_object() && r.value("status", "") == "success") << expr << "\n" << r.dump();
    return r.is_object() && r.contains("data") ? r : json{{"data", {{"result", json::array()}}}};
  };

  // The run variable's query finds both runs; the rank variable's both ranks.
  EXPECT_EQ(label_values(query(R"(count by (run) (trainer_build_info{host=~"ci-host"}))"), "run"),
            (std::multiset<std::string>{"run-a", "run-b"}));
  EXPECT_EQ(ranks_in(query(R"(count by (rank) (trainer_build_info{host=~"ci-host"}))")),
            (std::multiset<std::string>{"0", "1"}));

  std::vector<testing::DashboardQuery> queries = testing::dashboard_queries(testing::load_dashboard());
  ASSERT_GE(queries.size(), 20u);
  for (const auto& a : testing::annotation_queries(testing::load_dashboard())) queries.push_back(a);
  for (const auto& q : queries) {
    SCOPED_TRACE(q.panel + " / " + q.ref + ": " + q.expr);
    // Annotations look for events (checkpoints, epoch ends) over a window that reaches back to the
    // runs' start, so every event seen before `at` counts.
    const std::string window_of_q = q.ref == "annotation" ? "30m" : rate_window;
    // All ranks selected: queries that keep the rank label show both ranks, except topk/bottomk, which
    // pick ranks by design (the straggler panel's slowest rank).
    const json all = query(testing::substitute_variables(q.expr, window_of_q));
    EXPECT_FALSE(all["data"]["result"].empty()) << all.dump();
    const std::multiset<std::string> all_ranks = ranks_in(all);
    const std::set<std::string> distinct(all_ranks.begin(), all_ranks.end());
    const bool picks_ranks =
        q.expr.find("topk(") != std::string::npos || q.expr.find("topk by") != std::string::npos;
    if (!all_ranks.count("") && !picks_ranks) {
      EXPECT_EQ(distinct, (std::set<std::string>{"0", "1"})) << all.dump();
    }
    // One rank selected: the panel still has data, from that rank only; so every rank feeds every panel,
    // including the ones that aggregate ranks away.
    for (const std::string rank : {"0", "1"}) {
      const json one = query(testing::substitute_variables(q.expr, window_of_q, rank));
      EXPECT_FALSE(one["data"]["result"].empty()) << "rank " << rank << ": " << one.dump();
      for (const std::string& r : ranks_in(one)) {
        if (!r.empty()) EXPECT_EQ(r, rank) << one.dump();
      }
    }
    // One run selected: data from that run only, so two runs on one host stay apart in every panel.
    for (const std::string& run : runs) {
      const json one = query(testing::substitute_variables(q.expr, window_of_q, ".*", run));
      EXPECT_FALSE(one["data"]["result"].empty()) << "run " << run << ": " << one.dump();
      for (const std::string& r : label_values(one, "run")) {
        if (!r.empty()) EXPECT_EQ(r, run) << one.dump();
      }
    }
  }

  // Stopped by SIGTERM (the ranks agree on the stop and exit with 128 + 15), not crashed.
  for (const auto& j : jobs) {
    const auto codes = j->wait_until(Clock::now() + std::chrono::seconds(30));
    for (int r = 0; r < j->size(); ++r) EXPECT_EQ(codes[r], 143) << "rank " << r << "\n" << j->outputs();
  }
}

}  // namespace
}  // namespace trainer
