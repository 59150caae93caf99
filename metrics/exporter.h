#pragma once
// The Prometheus pull exporter: one per rank, on metrics.bind:(metrics.port + LOCAL_RANK), so the ranks
// of one host use consecutive ports (9464, 9465, ...; configs/prometheus/prometheus.yml scrapes
// 9464-9471). Port 0 disables it: no thread, no socket, and every update is a cheap no-op.
//
// Every series carries the labels run, rank, local_rank and host (never job or instance: Prometheus
// adds those when it scrapes); `run` keeps two runs on one host apart. Names and units follow the
// conventions node-exporter and dcgm-exporter follow (base units, fractions as _ratio in [0, 1],
// counters as _total). Durations are counters of seconds (rates are exact over any window) except the
// whole step, which is also a histogram for its quantiles; a value not known yet (an evaluation that has
// not run, a GPU without NVML) is NaN, never a misleading 0. exported_series_names() lists every series
// name a scrape returns, generated from the same code that registers the metrics; the dashboard tests
// check the Grafana queries and the alerting rules against it. prometheus-cpp's Exposer adds three
// self-metrics of its own to each scrape (exposer_scrapes_total, exposer_transferred_bytes_total,
// exposer_request_latencies) without these labels; they are not ours and no dashboard uses them.
//
// Updates are thread-safe against the scraping thread; call them from the training thread.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "metrics/step_timer.h"

namespace trainer {

// Strings for trainer_build_info{version, revision, cuda, cudnn, nccl}; an empty one is exported as
// "none".
struct BuildInfo {
  std::string version;
  std::string revision;  // the git commit (TrainerBuild::revision)
  std::string cuda;
  std::string cudnn;
  std::string nccl;
};

struct ExporterOptions {
  int port = 0;        // metrics.port: the base port; 0 disables the exporter
  int local_rank = 0;  // LOCAL_RANK: the exporter listens on port + local_rank
  int rank = 0;        // RANK (global)
  int world_size = 1;  // trainer_world_size, for the "ranks up" panel
  std::string host;    // the host label; empty = gethostname()
  std::string run;     // the run label (metrics.run, or the run directory's name)
  // metrics.bind: loopback by default, since a training host's metrics need not be public; "0.0.0.0"
  // serves every interface (a Prometheus server on another host).
  std::string bind_address = "127.0.0.1";
  BuildInfo build;
};

// Device memory in bytes, for trainer_device_memory_bytes{kind="allocated|reserved|peak"}.
struct DeviceMemory {
  int64_t allocated = 0;
  int64_t reserved = 0;
  int64_t peak = 0;
};

class Exporter {
 public:
  // Starts serving /metrics when options.port > 0. Throws std::runtime_error with a HINT when the port
  // is in use or cannot be bound (which port, which LOCAL_RANK, how to change metrics.port).
  explicit Exporter(const ExporterOptions& options);
  ~Exporter();
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  bool enabled() const { return state_ != nullptr; }
  int port() const { return port_; }  // the port listened on; 0 when disabled
  std::string url() const;            // "http://<bind address>:<port>/metrics"; empty when disabled

  // A resolved step: its whole time in the trainer_step_seconds histogram, the exclusive phases and
  // `other` added to trainer_step_phase_seconds_total{phase} (they sum to the step), the overlapping
  // all-reduce to trainer_allreduce_seconds_total.
  void observe_step(const StepTimes& t);
  // Counters: call once per optimizer step (skipped ones included) with that step's samples on this rank.
  void add_step(int64_t samples);
  void add_skipped_steps(int64_t n = 1);  // steps skipped by the fp16 loss scaler (inf/nan gradients)
  void add_bad_samples(int64_t n);        // samples the loader dropped as unreadable or corrupt
  // The same from a running total (Dataset::skipped_samples()): adds what is new since the last call.
  void set_bad_samples_total(int64_t total);
  // A step's training loss into trainer_train_loss_{sum,count}: rate(sum) / rate(count) is the exact
  // mean loss over any window, where a last-step gauge shows whichever step a scrape happened to see.
  void observe_loss(double loss);
  void add_epoch_end();   // trainer_epochs_completed_total, for the dashboard's epoch annotations
  void add_checkpoint();  // trainer_checkpoints_total, for its checkpoint annotations
  // Gauges.
  void set_learning_rate(double lr);
  void set_loss_scale(double scale);
  void set_samples_per_second(double rate);
  void set_device_memory(const DeviceMemory& m);
  void set_epoch(int64_t epoch);  // 1-based epoch being trained
  // The last evaluation: top-1 and top-5 as ratios in [0, 1], the mean test loss. NaN until then.
  void set_eval(double top1, double top5, double loss);
  // The same for the weight average's evaluation (ema.enabled), as trainer_ema_eval_*.
  void set_ema_eval(double top1, double top5, double loss);
  // data.cache of the training or evaluation split: files and bytes held (FileCache::files() and
  // bytes()), as trainer_data_cache_files{split} and trainer_data_cache_bytes{split}.
  void set_data_cache(bool training, int64_t files, uint64_t bytes);
  // NVML's GPU utilisation of this rank's GPU, ratio in [0, 1] (metrics/gpu_utilization.h); NaN until set
  // or when a read fails. Safe from any thread (a gauge): a PeriodicReader sets it.
  void set_gpu_utilization(double ratio);

  // The metrics in the Prometheus text format, as a scrape would return them ("" when disabled).
  std::string render() const;

  // Every series name a scrape returns (histograms as _bucket, _sum and _count), sorted.
  static std::vector<std::string> exported_series_names();
  // The labels every series carries, and all label names any series may carry (including le).
  static std::vector<std::string> common_label_names();
  static std::vector<std::string> exported_label_names();
  // The step histogram's bucket upper bounds in seconds: 1, 2.5, 5 per decade from 100 us to 10 s. Each
  // prints exactly in the text format (prometheus-cpp writes 16 significant digits, which turn 0.562
  // or 0.56 into le="0.5620000000000001"; these bounds have no such neighbours).
  static std::vector<double> step_buckets();

 private:
  struct State;
  std::shared_ptr<State> state_;
  int port_ = 0;
  std::string bind_address_;
};

// How many times the launcher restarted this job before starting this process: TRAINER_RESTART_COUNT
// (`trainer launch --max-restarts`), else torchrun's TORCHELASTIC_RESTART_COUNT, else 0. The exporter
// serves it as trainer_restarts_total.
int launcher_restart_count();

}  // namespace trainer
