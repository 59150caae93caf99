#include "metrics/exporter.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>

// civetweb (the HTTP server inside prometheus-cpp's Exposer; Debian's 1.15 build) starts its worker
// threads with 100 KB stacks. glibc carves every thread's static TLS out of that stack, and OpenBLAS
// alone takes 60 KB of TLS, so in this process a worker overflows its stack on civetweb's error path:
// one request for a wrong URL (404) or a malformed one (400) killed the whole training run with SIGSEGV.
// Defining pthread_attr_setstacksize in the executable interposes it for the shared libraries: every
// thread a library creates gets at least 1 MiB (address space only; pages are committed when touched).
// tests/metrics/exporter_test.cpp covers both the 404 and the stack floor.
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (!real) return ENOSYS;
  constexpr size_t kMinStack = size_t{1} << 20;
  return real(attr, size < kMinStack ? kMinStack : size);
}

namespace trainer {
namespace {

namespace prom = prometheus;

// Every metric of the exporter, registered in one place: the exporter and exported_series_names()
// both go through here, so the list the dashboard tests check against cannot drift from what is served.
struct Metrics {
  std::array<prom::Histogram*, kNumPhases> phase{};
  prom::Counter* samples = nullptr;
  prom::Counter* steps = nullptr;
  prom::Counter* skipped_steps = nullptr;
  prom::Counter* bad_samples = nullptr;
  prom::Gauge* loss = nullptr;
  prom::Gauge* learning_rate = nullptr;
  prom::Gauge* loss_scale = nullptr;
  prom::Gauge* samples_per_second = nullptr;
  prom::Gauge* memory_allocated = nullptr;
  prom::Gauge* memory_reserved = nullptr;
  prom::Gauge* memory_peak = nullptr;
  prom::Gauge* epoch = nullptr;
  prom::Gauge* eval_accuracy = nullptr;
  prom::Gauge* gpu_utilization = nullptr;
  prom::Counter* restarts = nullptr;
};

// The labels on every series. Never job or instance: Prometheus sets those when it scrapes.
prom::Labels common_labels(int rank, int local_rank, const std::string& host) {
  return {{"rank", std::to_string(rank)}, {"local_rank", std::to_string(local_rank)}, {"host", host}};
}

std::string or_none(const std::string& s) { return s.empty() ? "none" : s; }

Metrics register_metrics(prom::Registry& registry, const prom::Labels& common, const BuildInfo& build) {
  Metrics m;
  auto counter = [&](const char* name, const char* help) -> prom::Counter& {
    return prom::BuildCounter().Name(name).Help(help).Labels(common).Register(registry).Add({});
  };
  auto gauge_family = [&](const char* name, const char* help) -> prom::Family<prom::Gauge>& {
    return prom::BuildGauge().Name(name).Help(help).Labels(common).Register(registry);
  };
  auto& phases = prom::BuildHistogram()
                     .Name("trainer_step_phase_seconds")
                     .Help(
                         "Seconds per training step spent in each phase (step = the whole step; "
                         "allreduce_total overlaps backward; other = step minus the exclusive phases)")
                     .Labels(common)
                     .Register(registry);
  const prom::Histogram::BucketBoundaries buckets = Exporter::step_phase_buckets();
  for (Phase p : kAllPhases)
    m.phase[static_cast<std::size_t>(p)] = &phases.Add({{"phase", std::string(phase_name(p))}}, buckets);
  m.samples = &counter("trainer_samples_total", "Training samples processed by this rank");
  m.steps = &counter("trainer_steps_total", "Optimizer steps taken, skipped ones included");
  m.skipped_steps =
      &counter("trainer_skipped_steps_total", "Steps skipped by the fp16 loss scaler (inf/nan)");
  m.bad_samples = &counter("trainer_bad_samples_total", "Samples dropped as unreadable or corrupt");
  m.loss = &gauge_family("trainer_loss", "Training loss of the last step").Add({});
  m.learning_rate = &gauge_family("trainer_learning_rate", "Learning rate of the last step").Add({});
  m.loss_scale =
      &gauge_family("trainer_loss_scale", "Loss scale of the fp16 gradient scaler (1 otherwise)").Add({});
  m.loss_scale->Set(1.0);
  m.samples_per_second =
      &gauge_family("trainer_samples_per_second", "Training samples per second on this rank").Add({});
  auto& memory =
      gauge_family("trainer_device_memory_bytes", "Device memory of this rank's caching allocator");
  m.memory_allocated = &memory.Add({{"kind", "allocated"}});
  m.memory_reserved = &memory.Add({{"kind", "reserved"}});
  m.memory_peak = &memory.Add({{"kind", "peak"}});
  m.epoch = &gauge_family("trainer_epoch", "Epoch being trained (1-based)").Add({});
  m.eval_accuracy =
      &gauge_family("trainer_eval_accuracy", "Top-1 accuracy of the last evaluation (ratio)").Add({});
  // NaN until a reading arrives: a rank on the CPU, or without NVML, shows no data rather than 0.
  m.gpu_utilization = &gauge_family("trainer_gpu_utilization_ratio",
                                    "Fraction of NVML's last sample period in which a kernel ran on this "
                                    "rank's GPU (NaN: no reading)")
                           .Add({});
  m.gpu_utilization->Set(std::numeric_limits<double>::quiet_NaN());
  m.restarts = &counter("trainer_restarts_total",
                        "Restarts of this job by its launcher before this process started "
                        "(TRAINER_RESTART_COUNT, or torchrun's TORCHELASTIC_RESTART_COUNT)");
  gauge_family("trainer_build_info", "Build of the trainer binary; the value is always 1")
      .Add({{"version", or_none(build.version)},
            {"cuda", or_none(build.cuda)},
            {"cudnn", or_none(build.cudnn)},
            {"nccl", or_none(build.nccl)}})
      .Set(1.0);
  return m;
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// Fails with a message the user can act on when `address:port` cannot be bound. civetweb would only
// say "cannot bind" on stderr and throw an exception without the reason.
void check_port_free(const std::string& address, int port, const ExporterOptions& o) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) return;  // not IPv4: civetweb decides
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as civetweb does
  const int rc = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  const int err = errno;
  ::close(fd);
  if (rc == 0) return;
  const std::string where = address + ":" + std::to_string(port) + " (metrics.port " +
                            std::to_string(o.port) + " + LOCAL_RANK " + std::to_string(o.local_rank) + ")";
  const std::string change =
      "set metrics.port to another base port (each rank uses metrics.port + LOCAL_RANK, so keep the next "
      "LOCAL_WORLD_SIZE ports free), e.g. --set metrics.port=" +
      std::to_string(o.port + 100 <= 65000 ? o.port + 100 : 9400) +
      ", or metrics.port=0 to turn the exporter off";
  if (err == EADDRINUSE)
    throw std::runtime_error("metrics exporter: port " + std::to_string(port) +
                             " is already in use, cannot listen on " + where +
                             ". HINT: another trainer (or another rank with the same LOCAL_RANK) or a "
                             "service already listens there (see `ss -ltnp 'sport = :" +
                             std::to_string(port) + "'`); " + change);
  throw std::runtime_error("metrics exporter: cannot listen on " + where + ": " + std::strerror(err) +
                           ". HINT: " + (err == EACCES ? "ports below 1024 need root; " : "") + change);
}

}  // namespace

struct Exporter::State {
  std::shared_ptr<prom::Registry> registry = std::make_shared<prom::Registry>();
  Metrics m;
  std::unique_ptr<prom::Exposer> exposer;
  std::mutex mutex;               // for bad_samples_total (loader threads may report)
  int64_t bad_samples_total = 0;  // what trainer_bad_samples_total holds
};

Exporter::Exporter(const ExporterOptions& o) {
  if (o.port == 0) return;
  if (o.port < 0 || o.local_rank < 0 || o.port + o.local_rank > 65535)
    throw std::runtime_error(
        "metrics exporter: port " + std::to_string(o.port) + " + LOCAL_RANK " + std::to_string(o.local_rank) +
        " is not a valid TCP port. HINT: set metrics.port in 1..65535 minus the number of "
        "local ranks, or 0 to turn the exporter off");
  const int port = o.port + o.local_rank;
  const std::string bind = o.bind_address.empty() ? "0.0.0.0" : o.bind_address;
  check_port_free(bind, port, o);

  auto state = std::make_shared<State>();
  state->m = register_metrics(
      *state->registry, common_labels(o.rank, o.local_rank, o.host.empty() ? hostname() : o.host), o.build);
  try {
    state->exposer = std::make_unique<prom::Exposer>(bind + ":" + std::to_string(port), 2);
  } catch (const std::exception& e) {
    throw std::runtime_error(
        "metrics exporter: cannot listen on " + bind + ":" + std::to_string(port) + " (metrics.port " +
        std::to_string(o.port) + " + LOCAL_RANK " + std::to_string(o.local_rank) + "): " + e.what() +
        ". HINT: the port is probably in use; set metrics.port to another base port, or 0 to "
        "turn the exporter off");
  }
  state->m.restarts->Increment(launcher_restart_count());
  state->exposer->RegisterCollectable(state->registry);
  state_ = std::move(state);
  port_ = port;
  bind_address_ = bind;
}

Exporter::~Exporter() {
  if (state_) state_->exposer.reset();  // stop serving before the metrics go away
}

std::string Exporter::url() const {
  if (!state_) return "";
  return "http://" + bind_address_ + ":" + std::to_string(port_) + "/metrics";
}

void Exporter::observe_step(const StepTimes& t) {
  if (!state_) return;
  for (Phase p : kAllPhases) state_->m.phase[static_cast<std::size_t>(p)]->Observe(t[p]);
}

void Exporter::add_step(int64_t samples) {
  if (!state_) return;
  state_->m.steps->Increment();
  if (samples > 0) state_->m.samples->Increment(static_cast<double>(samples));
}

void Exporter::add_skipped_steps(int64_t n) {
  if (state_ && n > 0) state_->m.skipped_steps->Increment(static_cast<double>(n));
}

void Exporter::add_bad_samples(int64_t n) {
  if (!state_ || n <= 0) return;
  std::lock_guard lock(state_->mutex);
  state_->m.bad_samples->Increment(static_cast<double>(n));
  state_->bad_samples_total += n;
}

void Exporter::set_bad_samples_total(int64_t total) {
  if (!state_) return;
  std::lock_guard lock(state_->mutex);
  if (total > state_->bad_samples_total) {
    state_->m.bad_samples->Increment(static_cast<double>(total - state_->bad_samples_total));
    state_->bad_samples_total = total;
  }
}

void Exporter::set_loss(double v) {
  if (state_) state_->m.loss->Set(v);
}
void Exporter::set_learning_rate(double v) {
  if (state_) state_->m.learning_rate->Set(v);
}
void Exporter::set_loss_scale(double v) {
  if (state_) state_->m.loss_scale->Set(v);
}
void Exporter::set_samples_per_second(double v) {
  if (state_) state_->m.samples_per_second->Set(v);
}
void Exporter::set_device_memory(const DeviceMemory& mem) {
  if (!state_) return;
  state_->m.memory_allocated->Set(static_cast<double>(mem.allocated));
  state_->m.memory_reserved->Set(static_cast<double>(mem.reserved));
  state_->m.memory_peak->Set(static_cast<double>(mem.peak));
}
void Exporter::set_epoch(int64_t epoch) {
  if (state_) state_->m.epoch->Set(static_cast<double>(epoch));
}
void Exporter::set_eval_accuracy(double top1) {
  if (state_) state_->m.eval_accuracy->Set(top1);
}
void Exporter::set_gpu_utilization(double ratio) {
  if (state_) state_->m.gpu_utilization->Set(ratio);
}

std::string Exporter::render() const {
  if (!state_) return "";
  return prom::TextSerializer().Serialize(state_->registry->Collect());
}

std::vector<double> Exporter::step_phase_buckets() {
  // 10^(k/4) * 100 us for k = 0..20, rounded to 3 significant digits: 1e-4, 1.78e-4, 3.16e-4, 5.62e-4,
  // 1e-3, ..., 10.
  std::vector<double> b;
  for (int k = 0; k <= 20; ++k) {
    const double v = 1e-4 * std::pow(10.0, k / 4.0);
    const double scale = std::pow(10.0, 2 - static_cast<int>(std::floor(std::log10(v))));
    b.push_back(std::round(v * scale) / scale);
  }
  return b;
}

namespace {
std::vector<prom::MetricFamily> collect_all() {
  prom::Registry registry;
  register_metrics(registry, common_labels(0, 0, "host"), BuildInfo{});
  return registry.Collect();
}
}  // namespace

std::vector<std::string> Exporter::exported_series_names() {
  std::set<std::string> names;
  for (const prom::MetricFamily& f : collect_all()) {
    if (f.type == prom::MetricType::Histogram) {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) names.insert(f.name + suffix);
    } else if (f.type == prom::MetricType::Summary) {
      names.insert(f.name);
      for (const char* suffix : {"_sum", "_count"}) names.insert(f.name + suffix);
    } else {
      names.insert(f.name);
    }
  }
  return {names.begin(), names.end()};
}

std::vector<std::string> Exporter::common_label_names() {
  std::vector<std::string> names;
  for (const auto& [name, value] : common_labels(0, 0, "host")) names.push_back(name);
  return names;
}

std::vector<std::string> Exporter::exported_label_names() {
  std::set<std::string> names;
  for (const prom::MetricFamily& f : collect_all()) {
    if (f.type == prom::MetricType::Histogram) names.insert("le");
    for (const prom::ClientMetric& m : f.metric)
      for (const auto& l : m.label) names.insert(l.name);
  }
  return {names.begin(), names.end()};
}

int launcher_restart_count() {
  for (const char* name : {"TRAINER_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"})
    if (const char* v = std::getenv(name)) return std::max(0, std::atoi(v));
  return 0;
}

}  // namespace trainer
