// Prometheus' own checker on what we ship: `promtool check metrics` on a live exporter's /metrics
// (format and naming lint) and `promtool check rules` on every dashboard query, each written as a
// recording rule (promtool has no "check this expression" command; a rule file is how it parses PromQL).
// Skipped when promtool is absent (Debian's `prometheus` package, scripts/install-deps.sh).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "metrics/command.h"
#include "metrics/dashboard_util.h"
#include "metrics/exporter.h"
#include "metrics/http_client.h"
#include "metrics/prometheus_server.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

using testing::CommandResult;
using testing::run_command;

class Promtool : public ::testing::Test {
 protected:
  void SetUp() override {
    promtool_ = testing::find_executable("promtool");
    if (promtool_.empty())
      GTEST_SKIP() << "no promtool (Debian package `prometheus`, scripts/install-deps.sh)";
    dir_ = fs::temp_directory_path() / ("trainer_promtool_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  // A rule file with one recording rule per expression; the comment names where each came from.
  std::string rules_file(const std::vector<std::pair<std::string, std::string>>& sources_and_exprs) {
    std::string yaml = "groups:\n  - name: trainer_dashboard\n    rules:\n";
    int n = 0;
    for (const auto& [source, expr] : sources_and_exprs) {
      yaml += "      # " + source + "\n      - record: trainer_dashboard:query_" + std::to_string(++n) +
              "\n        expr: |\n          " + expr + "\n";
    }
    return write("rules.yml", yaml);
  }

  std::string promtool_;
  fs::path dir_;
};

TEST_F(Promtool, CheckMetricsPassesOnTheExportersOutput) {
  ExporterOptions o;
  o.port = testing::free_port();
  o.rank = 1;
  o.local_rank = 0;
  o.host = "test-host";
  o.bind_address = "127.0.0.1";
  o.build = {"0.1.0", "abc123def456", "13.0", "9.10", ""};
  o.run = "run-a";
  Exporter exporter(o);
  // Every metric holds a value, so every family (histogram buckets included) is in the scrape.
  StepTimes t;
  for (Phase p : kAllPhases) t[p] = 0.01;
  exporter.observe_step(t);
  exporter.add_step(32);
  exporter.add_skipped_steps();
  exporter.add_bad_samples(2);
  exporter.observe_loss(1.5);
  exporter.add_epoch_end();
  exporter.add_checkpoint();
  exporter.set_learning_rate(0.1);
  exporter.set_loss_scale(65536);
  exporter.set_samples_per_second(1000);
  exporter.set_device_memory({1 << 20, 2 << 20, 3 << 20});
  exporter.set_epoch(1);
  exporter.set_eval(0.5, 0.75, 1.25);
  exporter.set_gpu_utilization(0.5);

  const testing::HttpResponse r = testing::http_get(exporter.port(), "/metrics");
  ASSERT_EQ(r.status, 200);
  ASSERT_NE(r.body.find("trainer_step_seconds_bucket"), std::string::npos) << r.body;
  ASSERT_NE(r.body.find("process_cpu_seconds_total"), std::string::npos) << r.body;
  const std::string path = write("metrics.txt", r.body);
  const CommandResult c = run_command(promtool_ + " check metrics < " + path);
  EXPECT_EQ(c.exit_code, 0) << c.output << "\n--- scraped:\n" << r.body;
  EXPECT_EQ(c.output, "") << "promtool lint findings";
}

TEST_F(Promtool, CheckRulesPassesOnEveryDashboardQuery) {
  std::vector<std::pair<std::string, std::string>> exprs;
  const auto d = testing::load_dashboard();
  for (const auto& q : testing::dashboard_queries(d))
    exprs.push_back({q.panel + " / " + q.ref, testing::substitute_variables(q.expr)});
  for (const auto& q : testing::annotation_queries(d))
    exprs.push_back({q.panel + " / " + q.ref, testing::substitute_variables(q.expr)});
  ASSERT_GE(exprs.size(), 20u);
  const std::string path = rules_file(exprs);
  const CommandResult c = run_command(promtool_ + " check rules " + path);
  EXPECT_EQ(c.exit_code, 0) << c.output << "\n--- " << path << ":\n" << testing::read_text(path);
  EXPECT_NE(c.output.find("SUCCESS: " + std::to_string(exprs.size()) + " rules found"), std::string::npos)
      << c.output;
}

// The alerting rules we ship parse, and behave as their unit tests say (a rank stalled while the others
// advance, data_wait over 20%, a non-finite loss; configs/prometheus/trainer_rules_test.yml).
TEST_F(Promtool, AlertingRulesPassCheckAndTheirUnitTests) {
  const std::string dir = std::string(TRAINER_SOURCE_DIR) + "/configs/prometheus/";
  const CommandResult check = run_command(promtool_ + " check rules " + dir + "trainer_rules.yml");
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_NE(check.output.find("SUCCESS: 3 rules found"), std::string::npos) << check.output;
  const CommandResult unit =
      run_command("cd " + dir + " && " + promtool_ + " test rules trainer_rules_test.yml");
  EXPECT_EQ(unit.exit_code, 0) << unit.output;
  const CommandResult config = run_command(promtool_ + " check config " + dir + "prometheus.yml");
  EXPECT_EQ(config.exit_code, 0) << config.output;
}

// The check above is only worth something if promtool rejects a broken expression in the same file
// layout.
TEST_F(Promtool, CheckRulesRejectsABrokenExpression) {
  const std::string path = rules_file({{"good", "sum(rate(trainer_steps_total[1m]))"},
                                       {"broken", "sum by (rank (rate(trainer_steps_total[1m]))"}});
  const CommandResult c = run_command(promtool_ + " check rules " + path);
  EXPECT_NE(c.exit_code, 0) << c.output;
}

}  // namespace
}  // namespace trainer
