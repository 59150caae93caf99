#include "metrics/process_metrics.h"

#include <dirent.h>
#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace trainer {
namespace {

namespace prom = prometheus;

// utime and stime, fields 14 and 15 of /proc/self/stat, in clock ticks. The command name (field 2) may
// hold spaces and parentheses, so the fields are counted from its closing ')'.
std::optional<double> cpu_seconds() {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {  // field 3 (state) is the first after ')'
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  if (!fields) return std::nullopt;
  const long ticks = ::sysconf(_SC_CLK_TCK);
  return ticks > 0 ? std::optional<double>((utime + stime) / static_cast<double>(ticks)) : std::nullopt;
}

// The second field of /proc/self/statm: resident pages.
std::optional<double> resident_bytes() {
  std::ifstream in("/proc/self/statm");
  double size = 0, resident = 0;
  if (!(in >> size >> resident)) return std::nullopt;
  return resident * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

std::optional<double> open_fds() {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return std::nullopt;
  double n = 0;
  while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n - 1;  // the directory stream's own descriptor
}

prom::MetricFamily family(const char* name, const char* help, prom::MetricType type, double value,
                          const prom::Labels& labels) {
  prom::ClientMetric m;
  for (const auto& [k, v] : labels) m.label.push_back({k, v});
  if (type == prom::MetricType::Counter)
    m.counter.value = value;
  else
    m.gauge.value = value;
  return {name, help, type, {m}};
}

class ProcessCollector : public prom::Collectable {
 public:
  explicit ProcessCollector(prom::Labels labels) : labels_(std::move(labels)) {}
  std::vector<prom::MetricFamily> Collect() const override {
    const std::optional<ProcessStats> s = read_process_stats();
    if (!s) return {};
    return {
        family("process_cpu_seconds_total", "User and system CPU time spent in seconds",
               prom::MetricType::Counter, s->cpu_seconds, labels_),
        family("process_resident_memory_bytes", "Resident memory size in bytes", prom::MetricType::Gauge,
               s->resident_bytes, labels_),
        family("process_open_fds", "Number of open file descriptors", prom::MetricType::Gauge, s->open_fds,
               labels_),
        family("process_max_fds", "Maximum number of open file descriptors", prom::MetricType::Gauge,
               s->max_fds, labels_),
    };
  }

 private:
  prom::Labels labels_;
};

}  // namespace

std::optional<ProcessStats> read_process_stats() {
  const std::optional<double> cpu = cpu_seconds(), rss = resident_bytes(), fds = open_fds();
  if (!cpu || !rss || !fds) return std::nullopt;
  rlimit limit{};
  ProcessStats s{*cpu, *rss, *fds, 0.0};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    s.max_fds = static_cast<double>(limit.rlim_cur);
  return s;
}

std::shared_ptr<prom::Collectable> make_process_collector(const prom::Labels& labels) {
  return std::make_shared<ProcessCollector>(labels);
}

}  // namespace trainer
