// Every dashboard query runs against a real Prometheus server that scrapes a live exporter: the
// queries parse, the series exist under the names and labels the dashboard expects, and rate() windows
// work with the histogram. Skipped when the `prometheus` binary is absent (scripts/install-deps.sh
// installs Debian's package). Everything listens on 127.0.0.1; every wait is bounded.
#include "metrics/prometheus_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "metrics/dashboard_util.h"
#include "metrics/exporter.h"

namespace trainer {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Updates every metric a few times a second, like a training loop.
class FakeTraining {
 public:
  explicit FakeTraining(Exporter& e) : thread_([this, &e] { run(e); }) {}
  ~FakeTraining() {
    stop_ = true;
    thread_.join();
  }

 private:
  void run(Exporter& e) {
    int64_t step = 0;
    while (!stop_) {
      ++step;
      StepTimes t;
      t.step = step;
      t[Phase::data_wait] = 0.001;
      t[Phase::h2d] = 0.0005;
      t[Phase::forward] = 0.010 + 0.001 * (step % 3);
      t[Phase::backward] = 0.020;
      t[Phase::allreduce_exposed] = 0.002;
      t[Phase::optimizer] = 0.003;
      t[Phase::allreduce_total] = 0.012;
      t[Phase::step] = 0.040;
      t[Phase::other] = 0.0035;
      e.observe_step(t);
      e.add_step(64);
      if (step % 10 == 0) e.add_skipped_steps();
      if (step % 7 == 0) e.add_bad_samples(1);
      e.observe_loss(2.0 / static_cast<double>(step));
      if (step % 5 == 0) e.add_epoch_end();
      if (step % 5 == 0) e.add_checkpoint();
      e.set_learning_rate(0.1);
      e.set_loss_scale(32768);
      e.set_samples_per_second(1600);
      e.set_device_memory({100 << 20, 128 << 20, 110 << 20});
      e.set_epoch(1 + step / 50);
      e.set_eval(0.9, 0.99, 0.3);
      e.set_ema_eval(0.91, 0.995, 0.28);  // the weight average's (ema.enabled)
      e.set_gpu_utilization(0.8);
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
    }
  }
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

double first_value(const json& response) {
  return std::stod(response["data"]["result"][0]["value"][1].get<std::string>());
}

TEST(PrometheusServer, RunsEveryDashboardQuery) {
  const std::string binary = testing::find_executable("prometheus");
  if (binary.empty())
    GTEST_SKIP() << "no prometheus binary (Debian package `prometheus`, scripts/install-deps.sh)";
  const auto deadline = Clock::now() + std::chrono::seconds(28);

  ExporterOptions o;
  o.port = testing::free_port();
  o.rank = 3;
  o.local_rank = 0;
  o.host = "test-host";
  o.bind_address = "127.0.0.1";
  o.run = "run-a";
  o.world_size = 4;
  o.build = {"0.1.0", "abc123", "", "", ""};
  Exporter exporter(o);
  FakeTraining training(exporter);
  testing::PrometheusServer prom(binary, {exporter.port()});
  ASSERT_TRUE(prom.started()) << "cannot start " << binary;

  // Wait until Prometheus has scraped the exporter at least 3 times (rate() needs 2 points in its window).
  bool scraped = false;
  json last;
  while (!scraped && Clock::now() < deadline) {
    ASSERT_TRUE(prom.running()) << "prometheus exited:\n" << prom.log();
    last = prom.query("count_over_time(trainer_steps_total[10s])");
    scraped = last.is_object() && last.value("status", "") == "success" && !last["data"]["result"].empty() &&
              first_value(last) >= 3;
    if (!scraped) std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  ASSERT_TRUE(scraped) << "no 3 scrapes before the deadline; last answer: " << last.dump() << "\nlog:\n"
                       << prom.log();

  // The labels arrive as exported, and Prometheus's own job/instance do not clash with them.
  const json up =
      prom.query(R"(trainer_build_info{rank="3", local_rank="0", host="test-host", version="0.1.0"})");
  ASSERT_EQ(up["data"]["result"].size(), 1u) << up.dump();
  const json& labels = up["data"]["result"][0]["metric"];
  EXPECT_EQ(labels.value("job", ""), "trainer");
  EXPECT_EQ(labels.value("instance", ""), "127.0.0.1:" + std::to_string(exporter.port()));
  EXPECT_FALSE(labels.contains("exported_job"));
  EXPECT_FALSE(labels.contains("exported_instance"));
  EXPECT_EQ(labels.value("cuda", ""), "none");
  EXPECT_DOUBLE_EQ(first_value(prom.query("trainer_learning_rate")), 0.1);

  const json d = testing::load_dashboard();
  const auto queries = testing::dashboard_queries(d);
  ASSERT_GE(queries.size(), 20u);
  for (const auto& q : queries) {
    const std::string expr = testing::substitute_variables(q.expr);
    SCOPED_TRACE(q.panel + " / " + q.ref + ": " + expr);
    const json r = prom.query(expr);
    ASSERT_TRUE(r.is_object()) << "no answer from prometheus";
    EXPECT_EQ(r.value("status", ""), "success") << r.dump();
    if (r.value("status", "") != "success") continue;
    EXPECT_FALSE(r["data"]["result"].empty()) << "empty result";
    // With a live exporter every panel shows a number, except ratios of zero rates (none here).
    for (const auto& series : r["data"]["result"]) {
      const std::string v = series["value"][1];
      EXPECT_NE(v, "NaN") << series.dump();
    }
  }
  // The variables' label_values() queries as Prometheus series look-ups.
  const json hosts = prom.query(R"(count by (host) (trainer_build_info))");
  ASSERT_EQ(hosts["data"]["result"].size(), 1u) << hosts.dump();
  EXPECT_EQ(hosts["data"]["result"][0]["metric"]["host"], "test-host");
  const json ranks = prom.query(R"(count by (rank) (trainer_build_info{host=~"test-host"}))");
  ASSERT_EQ(ranks["data"]["result"].size(), 1u) << ranks.dump();
  EXPECT_EQ(ranks["data"]["result"][0]["metric"]["rank"], "3");

  // Spot checks of values through the dashboard's own expressions.
  const json share = prom.query(testing::substitute_variables(
      R"(sum by (rank) (rate(trainer_step_phase_seconds_total{host=~"$host", rank=~"$rank", phase="data_wait"}[$__rate_interval])) / sum by (rank) (rate(trainer_step_seconds_sum{host=~"$host", rank=~"$rank"}[$__rate_interval])))"));
  EXPECT_NEAR(first_value(share), 0.001 / 0.040, 1e-6) << share.dump();
  const json rate = prom.query(R"(sum(rate(trainer_samples_total[10s])))");
  EXPECT_GT(first_value(rate), 100.0) << rate.dump();
  EXPECT_LT(Clock::now(), deadline + std::chrono::seconds(10)) << "the test took too long";
}

}  // namespace
}  // namespace trainer
