#include "metrics/exporter.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/stat.h>

#include <cmath>
#include <ctime>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "metrics/http_client.h"

namespace trainer {
namespace {

using testing::http_get;

// One sample line of the Prometheus text format: name{label="value",...} value
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0.0;
};

std::vector<Sample> parse_exposition(const std::string& text) {
  std::vector<Sample> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    std::size_t i = line.find_first_of("{ ");
    s.name = line.substr(0, i);
    if (line[i] == '{') {
      ++i;
      while (line[i] != '}') {
        const std::size_t eq = line.find('=', i);
        const std::string key = line.substr(i, eq - i);
        std::size_t j = eq + 2;  // after ="
        std::string value;
        while (line[j] != '"') {
          if (line[j] == '\\') ++j;
          value += line[j++];
        }
        s.labels[key] = value;
        i = j + 1;
        if (line[i] == ',') ++i;
      }
      ++i;
    }
    s.value = std::stod(line.substr(i + 1));
    out.push_back(s);
  }
  return out;
}

// The value of the one sample with this name whose labels include `match`.
double value_of(const std::vector<Sample>& samples, const std::string& name,
                const std::map<std::string, std::string>& match = {}) {
  const Sample* found = nullptr;
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool ok = true;
    for (const auto& [k, v] : match) {
      // le values too are matched as printed: the bounds print exactly (BucketBoundsPrintExactly).
      ok = ok && s.labels.count(k) && s.labels.at(k) == v;
    }
    if (!ok) continue;
    if (found) throw std::runtime_error("several samples match " + name);
    found = &s;
  }
  if (!found) throw std::runtime_error("no sample " + name);
  return found->value;
}

ExporterOptions test_options(int port, int local_rank = 0) {
  ExporterOptions o;
  o.port = port;
  o.local_rank = local_rank;
  o.rank = 5;
  o.host = "node-a";
  o.bind_address = "127.0.0.1";
  o.run = "run-a";
  o.world_size = 8;
  o.build = {"0.1.0", "abc123def456", "13.0", "9.10.2", ""};
  return o;
}

int count_entries(const char* dir) {
  int n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

int count_sockets() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d)) {
      struct stat st {};
      if (e->d_name[0] != '.' && ::stat((std::string("/proc/self/fd/") + e->d_name).c_str(), &st) == 0 &&
          S_ISSOCK(st.st_mode))
        ++n;
    }
    ::closedir(d);
  }
  return n;
}

// Until the first evaluation the eval metrics are NaN (no data in Grafana), not 0 (a model that scores
// nothing).
TEST(Exporter, EvalMetricsAreNaNUntilTheFirstEvaluation) {
  Exporter exporter(test_options(testing::free_port(), 0));
  for (const char* name : {"trainer_eval_accuracy_ratio", "trainer_eval_top5_ratio", "trainer_eval_loss"})
    EXPECT_TRUE(std::isnan(value_of(parse_exposition(exporter.render()), name))) << name;
  exporter.set_eval(0.9, 0.99, 0.3);
  const std::vector<Sample> s = parse_exposition(exporter.render());
  EXPECT_EQ(value_of(s, "trainer_eval_accuracy_ratio"), 0.9);
  EXPECT_EQ(value_of(s, "trainer_eval_top5_ratio"), 0.99);
  EXPECT_EQ(value_of(s, "trainer_eval_loss"), 0.3);
}

// Every series carries run, rank, local_rank and host, so two runs on one host stay apart; the process
// metrics too.
TEST(Exporter, EverySeriesCarriesTheRunLabel) {
  Exporter exporter(test_options(testing::free_port(), 0));
  int process_series = 0;
  for (const Sample& x : parse_exposition(exporter.render())) {
    EXPECT_EQ(x.labels.count("run") ? x.labels.at("run") : "", "run-a") << x.name;
    EXPECT_EQ(x.labels.count("rank") ? x.labels.at("rank") : "", "5") << x.name;
    process_series += x.name.rfind("process_", 0) == 0;
  }
  EXPECT_EQ(process_series, 4);
}

// The process metrics read /proc: this process has some CPU time, resident memory and open files.
TEST(Exporter, ProcessMetricsComeFromProc) {
  Exporter exporter(test_options(testing::free_port(), 0));
  const std::vector<Sample> s = parse_exposition(exporter.render());
  EXPECT_GT(value_of(s, "process_resident_memory_bytes"), 1 << 20);
  // CPU time as this process's own clock counts it (user + system, clock ticks of 10 ms).
  EXPECT_NEAR(value_of(s, "process_cpu_seconds_total"), static_cast<double>(std::clock()) / CLOCKS_PER_SEC,
              0.05);
  EXPECT_GE(value_of(s, "process_open_fds"), 3);  // stdin, stdout, stderr, the listening socket
  EXPECT_GT(value_of(s, "process_max_fds"), value_of(s, "process_open_fds"));
}

// The exporter listens on loopback unless metrics.bind says otherwise.
TEST(Exporter, BindsToLoopbackByDefault) { EXPECT_EQ(ExporterOptions{}.bind_address, "127.0.0.1"); }

// Until a reading arrives (a rank on the CPU, or without NVML) the GPU utilisation is NaN, which
// Grafana shows as no data, not as an idle GPU.
TEST(Exporter, GpuUtilizationIsNaNUntilRead) {
  Exporter exporter(test_options(testing::free_port(), 0));
  ASSERT_TRUE(exporter.enabled());
  EXPECT_TRUE(std::isnan(value_of(parse_exposition(exporter.render()), "trainer_gpu_utilization_ratio")));
  exporter.set_gpu_utilization(0.5);
  EXPECT_EQ(value_of(parse_exposition(exporter.render()), "trainer_gpu_utilization_ratio"), 0.5);
}

// data.cache's holdings per split: 0 until set (nothing cached), then what the cache says.
TEST(Exporter, DataCacheGaugesPerSplit) {
  Exporter exporter(test_options(testing::free_port(), 0));
  ASSERT_TRUE(exporter.enabled());
  const auto value = [&](const char* name, const char* split) {
    return value_of(parse_exposition(exporter.render()), name, {{"split", split}});
  };
  EXPECT_EQ(value("trainer_data_cache_files", "training"), 0);
  exporter.set_data_cache(true, 12, 3145728);
  exporter.set_data_cache(false, 4, 1024);
  EXPECT_EQ(value("trainer_data_cache_files", "training"), 12);
  EXPECT_EQ(value("trainer_data_cache_bytes", "training"), 3145728);
  EXPECT_EQ(value("trainer_data_cache_files", "evaluation"), 4);
  EXPECT_EQ(value("trainer_data_cache_bytes", "evaluation"), 1024);
}

TEST(Exporter, ServesMetricsWithNamesLabelsAndValues) {
  // Base port one below a free port, LOCAL_RANK 1: the exporter listens on base + 1.
  const int free = testing::free_port();
  Exporter exporter(test_options(free - 1, /*local_rank=*/1));
  ASSERT_TRUE(exporter.enabled());
  EXPECT_EQ(exporter.port(), free);
  EXPECT_EQ(exporter.url(), "http://127.0.0.1:" + std::to_string(free) + "/metrics");

  StepTimes t;
  t[Phase::data_wait] = 0.0005;
  t[Phase::forward] = 0.004;
  t[Phase::backward] = 0.008;
  t[Phase::step] = 0.02;
  t[Phase::other] = 0.0075;
  exporter.observe_step(t);
  t[Phase::forward] = 0.5;
  exporter.observe_step(t);
  exporter.add_step(32);
  exporter.add_step(32);
  exporter.add_skipped_steps();
  exporter.add_bad_samples(1);
  exporter.set_bad_samples_total(3);  // a running total: adds 2
  exporter.set_bad_samples_total(2);  // never goes back
  exporter.observe_loss(0.25);
  exporter.observe_loss(0.75);
  exporter.add_epoch_end();
  exporter.add_checkpoint();
  exporter.add_checkpoint();
  exporter.set_learning_rate(0.1);
  exporter.set_loss_scale(65536);
  exporter.set_samples_per_second(1234.5);
  exporter.set_device_memory({1 << 20, 2 << 20, 3 << 20});
  exporter.set_epoch(2);
  exporter.set_eval(0.9125, 0.99, 0.5);
  exporter.set_gpu_utilization(0.75);

  const testing::HttpResponse r = http_get(exporter.port(), "/metrics");
  ASSERT_EQ(r.status, 200) << r.body;
  // The scrape holds what render() shows (but the process metrics, which move between the two reads).
  std::istringstream rendered(exporter.render());
  for (std::string line; std::getline(rendered, line);)
    if (line.find("process_") == std::string::npos) EXPECT_NE(r.body.find(line), std::string::npos) << line;
  EXPECT_NE(r.body.find("# TYPE trainer_step_seconds histogram"), std::string::npos);
  EXPECT_NE(r.body.find("# TYPE trainer_step_phase_seconds_total counter"), std::string::npos);
  EXPECT_NE(r.body.find("# TYPE trainer_samples_total counter"), std::string::npos);
  EXPECT_NE(r.body.find("# TYPE trainer_train_loss summary"), std::string::npos);
  const std::vector<Sample> s = parse_exposition(r.body);

  // prometheus-cpp's Exposer adds its own self-metrics (scrapes, bytes, latencies) without our labels;
  // everything else is ours.
  const std::set<std::string> library = {"exposer_transferred_bytes_total", "exposer_scrapes_total",
                                         "exposer_request_latencies", "exposer_request_latencies_count",
                                         "exposer_request_latencies_sum"};
  std::vector<Sample> ours;
  for (const Sample& x : s) {
    if (library.count(x.name)) continue;
    EXPECT_TRUE(x.name.rfind("trainer_", 0) == 0 || x.name.rfind("process_", 0) == 0) << x.name;
    ours.push_back(x);
  }
  // Every series carries rank, local_rank and host, and never job or instance.
  for (const Sample& x : ours) {
    ASSERT_TRUE(x.labels.count("rank") && x.labels.count("local_rank") && x.labels.count("host")) << x.name;
    EXPECT_EQ(x.labels.at("rank"), "5") << x.name;
    EXPECT_EQ(x.labels.at("local_rank"), "1") << x.name;
    EXPECT_EQ(x.labels.at("host"), "node-a") << x.name;
    EXPECT_EQ(x.labels.count("job"), 0u) << x.name;
    EXPECT_EQ(x.labels.count("instance"), 0u) << x.name;
  }
  // The names served are exactly the names the exporter declares (which the dashboard test uses).
  std::set<std::string> served;
  for (const Sample& x : ours) served.insert(x.name);
  const std::vector<std::string> declared = Exporter::exported_series_names();
  EXPECT_EQ(std::vector<std::string>(served.begin(), served.end()), declared);
  std::set<std::string> labels;
  for (const Sample& x : ours)
    for (const auto& [k, v] : x.labels) labels.insert(k);
  const std::vector<std::string> declared_labels = Exporter::exported_label_names();
  EXPECT_EQ(std::vector<std::string>(labels.begin(), labels.end()), declared_labels);

  // The whole step as a histogram (two steps of 0.02 s); the parts as counters of seconds that add up
  // to it (forward saw 0.004 s and 0.5 s); the overlapping all-reduce apart.
  EXPECT_EQ(value_of(s, "trainer_step_seconds_count"), 2);
  EXPECT_DOUBLE_EQ(value_of(s, "trainer_step_seconds_sum"), 0.04);
  EXPECT_EQ(value_of(s, "trainer_step_seconds_bucket", {{"le", "0.01"}}), 0);
  EXPECT_EQ(value_of(s, "trainer_step_seconds_bucket", {{"le", "0.025"}}), 2);
  EXPECT_EQ(value_of(s, "trainer_step_seconds_bucket", {{"le", "+Inf"}}), 2);
  EXPECT_DOUBLE_EQ(value_of(s, "trainer_step_phase_seconds_total", {{"phase", "forward"}}), 0.504);
  EXPECT_DOUBLE_EQ(value_of(s, "trainer_step_phase_seconds_total", {{"phase", "data_wait"}}), 0.001);
  EXPECT_DOUBLE_EQ(value_of(s, "trainer_step_phase_seconds_total", {{"phase", "other"}}), 0.015);
  for (const char* not_a_part : {"step", "allreduce_total"})
    EXPECT_THROW(value_of(s, "trainer_step_phase_seconds_total", {{"phase", not_a_part}}), std::runtime_error)
        << not_a_part;
  EXPECT_DOUBLE_EQ(value_of(s, "trainer_allreduce_seconds_total"), 0.0);
  // Loss as sum and count: the mean over any window is exact.
  EXPECT_EQ(value_of(s, "trainer_train_loss_sum"), 1.0);
  EXPECT_EQ(value_of(s, "trainer_train_loss_count"), 2);
  EXPECT_EQ(value_of(s, "trainer_epochs_completed_total"), 1);
  EXPECT_EQ(value_of(s, "trainer_checkpoints_total"), 2);
  EXPECT_EQ(value_of(s, "trainer_world_size"), 8);

  EXPECT_EQ(value_of(s, "trainer_samples_total"), 64);
  EXPECT_EQ(value_of(s, "trainer_steps_total"), 2);
  EXPECT_EQ(value_of(s, "trainer_skipped_steps_total"), 1);
  EXPECT_EQ(value_of(s, "trainer_bad_samples_total"), 3);
  EXPECT_EQ(value_of(s, "trainer_learning_rate"), 0.1);
  EXPECT_EQ(value_of(s, "trainer_loss_scale"), 65536);
  EXPECT_EQ(value_of(s, "trainer_samples_per_second"), 1234.5);
  EXPECT_EQ(value_of(s, "trainer_device_memory_bytes", {{"kind", "allocated"}}), 1 << 20);
  EXPECT_EQ(value_of(s, "trainer_device_memory_bytes", {{"kind", "reserved"}}), 2 << 20);
  EXPECT_EQ(value_of(s, "trainer_device_memory_bytes", {{"kind", "peak"}}), 3 << 20);
  EXPECT_EQ(value_of(s, "trainer_epoch"), 2);
  EXPECT_EQ(value_of(s, "trainer_eval_accuracy_ratio"), 0.9125);
  EXPECT_EQ(value_of(s, "trainer_gpu_utilization_ratio"), 0.75);
  EXPECT_EQ(value_of(s, "trainer_build_info",
                     {{"version", "0.1.0"},
                      {"revision", "abc123def456"},
                      {"cuda", "13.0"},
                      {"cudnn", "9.10.2"},
                      {"nccl", "none"}}),
            1);

  // Wrong URLs and malformed requests get an error answer and leave the process alive (civetweb's error
  // path used to overflow its worker stack here; see the top of metrics/exporter.cpp).
  EXPECT_EQ(http_get(exporter.port(), "/nothing").status, 404);
  EXPECT_EQ(http_get(exporter.port(), "/").status, 404);
  EXPECT_EQ(testing::http_raw(exporter.port(), "GARBAGE\r\n\r\n").status, 400);
  EXPECT_EQ(http_get(exporter.port(), "/metrics").status, 200);
}

TEST(Exporter, LibraryThreadsGetAtLeast1MiBOfStack) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 100 * 1024), 0);  // what civetweb asks for
  size_t size = 0;
  pthread_attr_getstacksize(&attr, &size);
  EXPECT_GE(size, size_t{1} << 20);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, size_t{16} << 20), 0);  // larger requests are kept
  pthread_attr_getstacksize(&attr, &size);
  EXPECT_EQ(size, size_t{16} << 20);
  pthread_attr_destroy(&attr);
}

TEST(Exporter, BucketsAre1_2p5_5PerDecadeFrom100usTo10s) {
  const std::vector<double> b = Exporter::step_buckets();
  ASSERT_EQ(b.size(), 16u);
  EXPECT_EQ(b.front(), 1e-4);
  EXPECT_EQ(b.back(), 10.0);
  for (std::size_t i = 1; i < b.size(); ++i) EXPECT_GT(b[i], b[i - 1]) << i;
}

// Every le label reads as the bound it stands for, the shortest way: no "0.5620000000000001".
TEST(Exporter, BucketBoundsPrintExactly) {
  Exporter exporter(test_options(testing::free_port(), 0));
  std::set<std::string> printed;
  for (const Sample& x : parse_exposition(exporter.render()))
    if (x.name == "trainer_step_seconds_bucket") printed.insert(x.labels.at("le"));
  std::set<std::string> expected = {"+Inf"};
  for (double bound : Exporter::step_buckets()) {
    std::ostringstream shortest;
    shortest << bound;  // 6 significant digits: more than any bound has
    expected.insert(shortest.str());
  }
  EXPECT_EQ(printed, expected);
}

TEST(Exporter, ReleasesThePortWhenDestroyed) {
  const int port = testing::free_port();
  { Exporter exporter(test_options(port)); }
  testing::PortHolder holder(port);  // throws if the port were still held
  EXPECT_EQ(holder.port(), port);
  EXPECT_EQ(http_get(port, "/metrics", 1).status, 0);
}

TEST(Exporter, PortInUseIsAClearErrorWithAHint) {
  testing::PortHolder busy;  // a listening socket on 127.0.0.1
  try {
    Exporter exporter(test_options(busy.port() - 2, /*local_rank=*/2));
    FAIL() << "expected an error for port " << busy.port();
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("port " + std::to_string(busy.port()) + " is already in use"), std::string::npos) << m;
    EXPECT_NE(m.find("metrics.port " + std::to_string(busy.port() - 2) + " + LOCAL_RANK 2"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("HINT"), std::string::npos) << m;
    EXPECT_NE(m.find("--set metrics.port="), std::string::npos) << m;
    EXPECT_NE(m.find("metrics.port=0"), std::string::npos) << m;
  }
}

TEST(Exporter, PortOutOfRangeIsAnError) {
  EXPECT_THROW(Exporter(test_options(65535, 1)), std::runtime_error);
  EXPECT_THROW(Exporter(test_options(-1)), std::runtime_error);
}

TEST(Exporter, PortZeroDisablesIt) {
  const int threads_before = count_entries("/proc/self/task");
  const int sockets_before = count_sockets();
  Exporter exporter(test_options(0, /*local_rank=*/3));
  EXPECT_FALSE(exporter.enabled());
  EXPECT_EQ(exporter.port(), 0);
  EXPECT_EQ(exporter.url(), "");
  StepTimes t;
  t[Phase::step] = 0.1;
  exporter.observe_step(t);  // every update is a no-op
  exporter.add_step(8);
  exporter.observe_loss(1.0);
  exporter.set_device_memory({1, 2, 3});
  EXPECT_EQ(exporter.render(), "");
  EXPECT_EQ(count_entries("/proc/self/task"), threads_before) << "no thread";
  EXPECT_EQ(count_sockets(), sockets_before) << "no socket";
}

}  // namespace
}  // namespace trainer
