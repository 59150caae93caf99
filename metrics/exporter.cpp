#include "metrics/exporter.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/summary.h>
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

#include "metrics/process_metrics.h"

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
  prom::Histogram* step = nullptr;
  std::array<prom::Counter*, kNumPhases> phase_seconds{};  // the exclusive phases and other; else null
  prom::Counter* allreduce_seconds = nullptr;
  prom::Summary* train_loss = nullptr;
  prom::Counter* samples = nullptr;
  prom::Counter* steps = nullptr;
  prom::Counter* skipped_steps = nullptr;
  prom::Counter* bad_samples = nullptr;
  prom::Counter* epochs_completed = nullptr;
  prom::Counter* checkpoints = nullptr;
  prom::Gauge* learning_rate = nullptr;
  prom::Gauge* loss_scale = nullptr;
  prom::Gauge* samples_per_second = nullptr;
  prom::Gauge* memory_allocated = nullptr;
  prom::Gauge* memory_reserved = nullptr;
  prom::Gauge* memory_peak = nullptr;
  prom::Gauge* epoch = nullptr;
  prom::Gauge* eval_top1 = nullptr;
  prom::Gauge* eval_top5 = nullptr;
  prom::Gauge* eval_loss = nullptr;
  prom::Gauge* ema_eval_top1 = nullptr;  // the weight average's (ema.enabled)
  prom::Gauge* ema_eval_top5 = nullptr;
  prom::Gauge* ema_eval_loss = nullptr;
  prom::Gauge* gpu_utilization = nullptr;
  std::array<prom::Gauge*, 2> cache_files{};  // [training, evaluation]
  std::array<prom::Gauge*, 2> cache_bytes{};
  prom::Counter* restarts = nullptr;
};

// The phases that partition a step (trainer_step_phase_seconds_total sums to trainer_step_seconds_sum):
// the exclusive ones and `other`. Not `step` (the whole) nor `allreduce_total` (it overlaps backward).
bool partitions_the_step(Phase p) { return p != Phase::step && p != Phase::allreduce_total; }

// The labels on every series. Never job or instance: Prometheus sets those when it scrapes.
prom::Labels common_labels(const std::string& run, int rank, int local_rank, const std::string& host) {
  return {{"run", run},
          {"rank", std::to_string(rank)},
          {"local_rank", std::to_string(local_rank)},
          {"host", host}};
}

std::string or_none(const std::string& s) { return s.empty() ? "none" : s; }

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Metrics register_metrics(prom::Registry& registry, const prom::Labels& common, const BuildInfo& build,
                         int world_size) {
  Metrics m;
  auto counter_family = [&](const char* name, const char* help) -> prom::Family<prom::Counter>& {
    return prom::BuildCounter().Name(name).Help(help).Labels(common).Register(registry);
  };
  auto counter = [&](const char* name, const char* help) -> prom::Counter& {
    return counter_family(name, help).Add({});
  };
  auto gauge_family = [&](const char* name, const char* help) -> prom::Family<prom::Gauge>& {
    return prom::BuildGauge().Name(name).Help(help).Labels(common).Register(registry);
  };
  auto gauge = [&](const char* name, const char* help, double initial) -> prom::Gauge& {
    prom::Gauge& g = gauge_family(name, help).Add({});
    g.Set(initial);
    return g;
  };
  m.step = &prom::BuildHistogram()
                .Name("trainer_step_seconds")
                .Help("Seconds per training step, from the loader's batch to the optimizer's update")
                .Labels(common)
                .Register(registry)
                .Add({}, Exporter::step_buckets());
  auto& phases = counter_family("trainer_step_phase_seconds_total",
                                "Seconds of training steps spent in each phase; the phases partition the "
                                "step (other = the step minus the timed phases), so their sum is "
                                "trainer_step_seconds_sum");
  for (Phase p : kAllPhases)
    if (partitions_the_step(p))
      m.phase_seconds[static_cast<std::size_t>(p)] = &phases.Add({{"phase", std::string(phase_name(p))}});
  m.allreduce_seconds = &counter("trainer_allreduce_seconds_total",
                                 "Seconds from the first gradient all-reduce's launch to the last one's "
                                 "completion; overlaps backward (its exposed part is phase "
                                 "allreduce_exposed)");
  m.train_loss = &prom::BuildSummary()
                      .Name("trainer_train_loss")
                      .Help(
                          "Training loss of this rank's steps (sum and count: rate(sum) / rate(count) "
                          "is the mean loss over a window)")
                      .Labels(common)
                      .Register(registry)
                      .Add({}, prom::Summary::Quantiles{});
  m.samples = &counter("trainer_samples_total", "Training samples processed by this rank");
  m.steps = &counter("trainer_steps_total", "Optimizer steps taken, skipped ones included");
  m.skipped_steps =
      &counter("trainer_skipped_steps_total", "Steps skipped by the fp16 loss scaler (inf/nan)");
  m.bad_samples = &counter("trainer_bad_samples_total", "Samples dropped as unreadable or corrupt");
  m.epochs_completed = &counter("trainer_epochs_completed_total", "Epochs this process has completed");
  m.checkpoints = &counter("trainer_checkpoints_total", "Checkpoints this process has taken part in");
  m.learning_rate = &gauge("trainer_learning_rate", "Learning rate of the last step", kNaN);
  m.loss_scale = &gauge("trainer_loss_scale", "Loss scale of the fp16 gradient scaler (1 otherwise)", 1.0);
  m.samples_per_second =
      &gauge("trainer_samples_per_second", "Training samples per second on this rank (this epoch)", kNaN);
  auto& memory =
      gauge_family("trainer_device_memory_bytes", "Device memory of this rank's caching allocator");
  m.memory_allocated = &memory.Add({{"kind", "allocated"}});
  m.memory_reserved = &memory.Add({{"kind", "reserved"}});
  m.memory_peak = &memory.Add({{"kind", "peak"}});
  m.epoch = &gauge("trainer_epoch", "Epoch being trained (1-based)", kNaN);
  // NaN until the first evaluation: 0 would read as a model that scores nothing.
  m.eval_top1 =
      &gauge("trainer_eval_accuracy_ratio", "Top-1 accuracy of the last evaluation (NaN: none yet)", kNaN);
  m.eval_top5 =
      &gauge("trainer_eval_top5_ratio", "Top-5 accuracy of the last evaluation (NaN: none yet)", kNaN);
  m.eval_loss = &gauge("trainer_eval_loss", "Mean test loss of the last evaluation (NaN: none yet)", kNaN);
  // NaN without ema.enabled: the series exist in every run, so the dashboards need no second layout.
  m.ema_eval_top1 = &gauge("trainer_ema_eval_accuracy_ratio",
                           "Top-1 accuracy of the weight average at the last evaluation (NaN: none)", kNaN);
  m.ema_eval_top5 = &gauge("trainer_ema_eval_top5_ratio",
                           "Top-5 accuracy of the weight average at the last evaluation (NaN: none)", kNaN);
  m.ema_eval_loss = &gauge("trainer_ema_eval_loss",
                           "Mean test loss of the weight average at the last evaluation (NaN: none)", kNaN);
  // NaN until a reading arrives: a rank on the CPU, or without NVML, shows no data rather than 0.
  m.gpu_utilization = &gauge("trainer_gpu_utilization_ratio",
                             "Fraction of NVML's last sample period in which a kernel ran on this "
                             "rank's GPU (NaN: no reading)",
                             kNaN);
  // 0 without data.cache, which is the truth: nothing is cached.
  auto& cache_files = gauge_family("trainer_data_cache_files",
                                   "Files of each split held in data.cache (encoded or decoded), by any of "
                                   "the node's ranks sharing it");
  auto& cache_bytes = gauge_family("trainer_data_cache_bytes",
                                   "Bytes of each split's data.cache taken, with 8 a file of bookkeeping");
  for (size_t s = 0; s < 2; ++s) {
    const std::string split = s == 0 ? "training" : "evaluation";
    m.cache_files[s] = &cache_files.Add({{"split", split}});
    m.cache_bytes[s] = &cache_bytes.Add({{"split", split}});
  }
  m.restarts = &counter("trainer_restarts_total",
                        "Restarts of this job by its launcher before this process started "
                        "(TRAINER_RESTART_COUNT, or torchrun's TORCHELASTIC_RESTART_COUNT)");
  gauge("trainer_world_size", "Ranks in the job (WORLD_SIZE); count the ranks up against it",
        static_cast<double>(world_size));
  gauge_family("trainer_build_info", "Build of the trainer binary; the value is always 1")
      .Add({{"version", or_none(build.version)},
            {"revision", or_none(build.revision)},
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
      std::to_string(o.port + 100 <= 65000 ? o.port + 100 : 9464) +
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
  std::shared_ptr<prom::Collectable> process;  // process_* from /proc, read at each scrape
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
  const std::string bind = o.bind_address.empty() ? "127.0.0.1" : o.bind_address;
  check_port_free(bind, port, o);

  auto state = std::make_shared<State>();
  const prom::Labels labels = common_labels(o.run.empty() ? "none" : o.run, o.rank, o.local_rank,
                                            o.host.empty() ? hostname() : o.host);
  state->m = register_metrics(*state->registry, labels, o.build, o.world_size);
  state->process = make_process_collector(labels);
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
  state->exposer->RegisterCollectable(state->process);
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
  state_->m.step->Observe(t[Phase::step]);
  for (Phase p : kAllPhases)
    if (prom::Counter* c = state_->m.phase_seconds[static_cast<std::size_t>(p)]; c && t[p] > 0)
      c->Increment(t[p]);
  if (t[Phase::allreduce_total] > 0) state_->m.allreduce_seconds->Increment(t[Phase::allreduce_total]);
}

void Exporter::observe_loss(double loss) {
  if (state_) state_->m.train_loss->Observe(loss);
}

void Exporter::add_epoch_end() {
  if (state_) state_->m.epochs_completed->Increment();
}

void Exporter::add_checkpoint() {
  if (state_) state_->m.checkpoints->Increment();
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
void Exporter::set_eval(double top1, double top5, double loss) {
  if (!state_) return;
  state_->m.eval_top1->Set(top1);
  state_->m.eval_top5->Set(top5);
  state_->m.eval_loss->Set(loss);
}
void Exporter::set_ema_eval(double top1, double top5, double loss) {
  if (!state_) return;
  state_->m.ema_eval_top1->Set(top1);
  state_->m.ema_eval_top5->Set(top5);
  state_->m.ema_eval_loss->Set(loss);
}
void Exporter::set_data_cache(bool training, int64_t files, uint64_t bytes) {
  if (!state_) return;
  state_->m.cache_files[training ? 0 : 1]->Set(static_cast<double>(files));
  state_->m.cache_bytes[training ? 0 : 1]->Set(static_cast<double>(bytes));
}
void Exporter::set_gpu_utilization(double ratio) {
  if (state_) state_->m.gpu_utilization->Set(ratio);
}

std::string Exporter::render() const {
  if (!state_) return "";
  std::vector<prom::MetricFamily> families = state_->registry->Collect();
  for (prom::MetricFamily& f : state_->process->Collect()) families.push_back(std::move(f));
  return prom::TextSerializer().Serialize(families);
}

std::vector<double> Exporter::step_buckets() {
  // From decimal literals, not computed: 2.5e-3 computed as 2.5 * 1e-3 can land one ulp off and print
  // with 16 digits.
  return {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

namespace {
std::vector<prom::MetricFamily> collect_all() {
  prom::Registry registry;
  const prom::Labels labels = common_labels("run", 0, 0, "host");
  register_metrics(registry, labels, BuildInfo{}, 1);
  std::vector<prom::MetricFamily> families = registry.Collect();
  for (prom::MetricFamily& f : make_process_collector(labels)->Collect()) families.push_back(std::move(f));
  return families;
}
}  // namespace

std::vector<std::string> Exporter::exported_series_names() {
  std::set<std::string> names;
  for (const prom::MetricFamily& f : collect_all()) {
    if (f.type == prom::MetricType::Histogram) {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) names.insert(f.name + suffix);
    } else if (f.type == prom::MetricType::Summary) {
      // A summary without quantiles (trainer_train_loss) has no series of its bare name.
      if (!f.metric.empty() && !f.metric[0].summary.quantile.empty()) names.insert(f.name);
      for (const char* suffix : {"_sum", "_count"}) names.insert(f.name + suffix);
    } else {
      names.insert(f.name);
    }
  }
  return {names.begin(), names.end()};
}

std::vector<std::string> Exporter::common_label_names() {
  std::vector<std::string> names;
  for (const auto& [name, value] : common_labels("run", 0, 0, "host")) names.push_back(name);
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
