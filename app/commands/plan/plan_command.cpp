#include "app/commands/plan/plan_command.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

#include "app/common/cli.h"
#include "app/common/format.h"
#include "app/common/system_info.h"
#include "app/config/config.h"
#include "app/run/datasets.h"
#include "app/run/device_setup.h"
#include "app/run/experiment.h"
#include "dist/collective_smoke.h"
#include "dist/gradient_reducer.h"
#include "nn/allocator.h"
#include "nn/amp/autocast.h"
#include "nn/functional.h"
#include "nn/runtime.h"

namespace trainer {
namespace {

const char* kPlanUsage =
    "usage: trainer plan CONFIG --procs N [--device-memory GiB] [--bus-bandwidth GB/s|measure]\n"
    "                   [--set k=v ...]\n\n"
    "Estimates memory per rank for CONFIG at N ranks under plain data parallelism (DP) and ZeRO stages 1-3:\n"
    "weights and gradients (fp32 in every precision: autocast's weights are the master copy) and optimizer\n"
    "moments (SGD with momentum: 1,\n"
    "AdamW: 2) from the parameter count, plus activation memory measured by one dry-run forward + backward\n"
    "step at data.batch_size on train.device. ZeRO-1 shards optimizer state and master weights across the\n"
    "ranks, ZeRO-2 also gradients, ZeRO-3 also weights. With --device-memory (default: the GPU's memory on "
    "a\n"
    "CUDA device) it recommends the simplest strategy that fits with 10% headroom. With --bus-bandwidth it\n"
    "prints the ring all-reduce time of the gradients per step, 2(N-1)/N x bytes / bandwidth; `measure`\n"
    "takes the bandwidth of `trainer doctor`'s all-reduce smoke test at its largest size (NCCL across\n"
    "this host's GPUs when there are 2 or more, else the CPU communicator between 2 local ranks): a\n"
    "local figure, an upper bound for ranks on several hosts.\n"
    "With ema.enabled, the weight average's copy of the parameters and buffers is its own column: every\n"
    "rank keeps it whole, under every strategy.\n"
    "The row of the config's dist.zero_stage is marked; its optimizer state and total per rank are printed\n"
    "in bytes.\n"
    "The dataset need not be present: its shape is enough (random images are used for the dry run).\n";

double parse_number(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !(v > 0))
    throw UsageError(flag + " expects a positive number, got '" + value + "'");
  return v;
}

struct PlanArgs {
  std::string config_path;
  int procs = 0;
  double device_memory_gib = 0, bus_gbps = 0;
  bool measure_bus = false;  // --bus-bandwidth measure
  std::vector<std::string> overrides;
  bool help = false;
};

PlanArgs parse_plan_args(const std::vector<std::string>& args) {
  PlanArgs a;
  ArgWalker w(args);
  while (w.next()) {
    const std::string& arg = w.arg();
    if (arg == "--help" || arg == "-h")
      a.help = true;
    else if (arg == "--procs") {
      const double v = parse_number(arg, w.value());
      if (v != std::floor(v)) throw UsageError("--procs expects a whole number");
      a.procs = static_cast<int>(v);
    } else if (arg == "--device-memory")
      a.device_memory_gib = parse_number(arg, w.value());
    else if (arg == "--bus-bandwidth") {
      const std::string v = w.value();
      if (v == "measure")
        a.measure_bus = true;
      else
        a.bus_gbps = parse_number(arg, v);
    } else if (arg == "--set")
      a.overrides.push_back(set_override(w.value()));
    else
      w.config_or_unknown(a.config_path);
  }
  if (a.help) return a;
  if (a.config_path.empty())
    throw UsageError("missing CONFIG (a TOML file, e.g. configs/cifar10_resnet18.toml)");
  if (a.procs < 1) throw UsageError("--procs N is required (the number of ranks to plan for)");
  return a;
}

std::string mib(double bytes) { return fmt("%.1f MiB", bytes / (1024.0 * 1024.0)); }

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

// The config with its dataset replaced by random images of the same shape and one batch of them: the
// dry run needs the shape only, not the files. Returns a note when the real dataset could not be opened.
Config dry_run_config(const Config& c, std::string* note) {
  int64_t channels = 3, size = 32, classes = 10;
  try {
    const Datasets d = open_datasets(c, 1);  // the dry run is one process, alone on this host
    channels = d.train->channels();
    size = d.train->height();
    classes = d.train->num_classes();
  } catch (const std::exception& e) {
    const std::string& n = c.data.dataset;
    if (n == "fashion_mnist")
      channels = 1, size = 28;
    else if (n == "cifar100")
      classes = 100;
    else if (n == "image_folder")
      size = c.data.image_size > 0 ? c.data.image_size : 224, classes = 1000;
    else if (n == "synthetic")
      size = c.data.synthetic_image_size, classes = c.data.synthetic_classes;
    *note = fmt("the dataset could not be opened (%s); assuming %lldx%lldx%lld images, %lld classes",
                e.what(), static_cast<long long>(size), static_cast<long long>(size),
                static_cast<long long>(channels), static_cast<long long>(classes));
  }
  Config out = c;
  out.data.dataset = "synthetic";
  out.data.synthetic_samples = c.data.batch_size * c.train.grad_accum_steps;
  out.data.synthetic_image_size = static_cast<int>(size);
  out.data.synthetic_classes = static_cast<int>(std::min<int64_t>(classes, 256));
  out.model.in_channels = static_cast<int>(c.model.in_channels > 0 ? c.model.in_channels : channels);
  if (c.model.num_classes == 0) out.model.num_classes = static_cast<int>(classes);
  return out;
}

struct DryRun {
  int64_t params = 0;
  int64_t baseline_bytes = 0;    // weights, buffers and gradients before the measured step
  int64_t peak_bytes = 0;        // during the measured step
  int64_t activation_bytes = 0;  // peak - baseline
  int64_t ema_bytes = 0;         // ema.enabled: the weight average's copy (ModelEma::bytes), else 0
  std::string device;
  std::vector<int64_t> buckets;  // elements per gradient bucket, as the reducer and ZeRO-2 form them
};

int64_t allocated_now(Device d) {
  return d.is_cuda() ? runtime::device_memory_stats().allocated_bytes : cpu_memory_stats().allocated_bytes;
}
int64_t peak_now(Device d) {
  if (!d.is_cuda()) return cpu_memory_stats().peak_allocated_bytes;
  runtime::synchronize();
  return runtime::device_memory_stats().peak_allocated_bytes;
}
void reset_peak(Device d) {
  if (d.is_cuda()) return runtime::reset_peak_device_memory();
  cpu_reset_peak_memory_stats();
}

// Two forward + backward steps at the configured batch; the second is measured with the gradients of the
// first still allocated, so peak - baseline is what the step adds: activations, the input batch and
// temporaries.
DryRun dry_run(const Config& config) {
  const RunDevice run_device = setup_device(config, 0);
  const Device device = run_device.device;
  Experiment e = build_experiment(config, run_device, false);
  e.model->train();
  const Dataset& train = *e.data.train;
  const int64_t b = config.data.batch_size;
  DryRun r;
  r.params = e.model->parameter_count();
  r.device = device.str();
  const std::vector<NamedParameter> named = e.model->named_parameters();
  for (const std::vector<int>& bucket : plan_gradient_buckets(named, ReducerOptions{})) {
    int64_t numel = 0;
    for (int i : bucket) numel += named[static_cast<size_t>(i)].param.numel();
    r.buckets.push_back(numel);
  }
  // On a GPU the step runs as training will (autocast, channels-last); the CPU has fp32 only.
  const std::optional<DType> half = device.is_cuda() ? run_device.precision.autocast : std::nullopt;
  const MemoryFormat format = device.is_cuda() ? run_device.precision.input_format : MemoryFormat::contiguous;
  auto step = [&]() {
    Tensor images =
        Tensor::full({b, train.channels(), train.height(), train.width()}, 0.5, DType::f32, device)
            .contiguous(format);
    Tensor labels = Tensor::zeros({b}, DType::i64, device);
    Variable loss;
    {
      AutocastScope autocast(half);
      loss = F::cross_entropy((*e.model)(Variable(images)), labels, config.train.label_smoothing);
    }
    loss.backward();
  };
  step();
  r.baseline_bytes = allocated_now(device);
  reset_peak(device);
  step();
  r.peak_bytes = peak_now(device);
  r.activation_bytes = std::max<int64_t>(0, r.peak_bytes - r.baseline_bytes);
  // The average training would keep (after the measured step: it is no activation).
  if (const std::unique_ptr<ModelEma> ema = make_model_ema(config, *e.model)) r.ema_bytes = ema->bytes();
  return r;
}

}  // namespace

BytesPerParam bytes_per_param(OptimizerKind optimizer, double momentum) {
  BytesPerParam b;
  // Autocast (nn/amp/autocast.h) keeps the weights and their gradients in fp32: the weights are the
  // master copy, and the half copies the forward pass casts live only during the step (they are part
  // of the measured activations). So every precision stores 4 + 4 bytes per parameter.
  b.weights = b.gradients = 4;
  b.master = 0;
  const bool two_moments = optimizer == OptimizerKind::adamw || optimizer == OptimizerKind::lamb;
  b.optimizer = two_moments ? 8 : (momentum > 0 ? 4 : 0);
  return b;
}

std::vector<StrategyMemory> strategy_memory(int64_t params, const BytesPerParam& b, int64_t activation_bytes,
                                            int ranks, const std::vector<int64_t>& buckets,
                                            int64_t ema_bytes) {
  const double p = static_cast<double>(params), n = ranks;
  std::vector<StrategyMemory> out;
  const char* names[] = {"DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"};
  // A sharded quantity holds ceil(params / ranks) elements per rank: the flat vector of all parameters
  // is padded to a multiple of the ranks (dist/zero_optimizer.h).
  const double shard = std::ceil(p / n);
  for (int s = 0; s < 4; ++s) {
    StrategyMemory m;
    m.strategy = static_cast<Strategy>(s);
    m.name = names[s];
    m.weights = (s >= 3 ? shard : p) * b.weights;
    m.gradients = (s >= 2 ? shard : p) * b.gradients;
    m.master = (s >= 1 ? shard : p) * b.master;
    m.optimizer = (s >= 1 ? shard : p) * b.optimizer;
    m.activations = static_cast<double>(activation_bytes);
    m.ema = static_cast<double>(ema_bytes);
    out.push_back(m);
  }
  if (!buckets.empty()) {
    double shard2 = 0, largest = 0, largest_padded = 0;
    for (int64_t numel : buckets) {
      const double chunk = std::ceil(static_cast<double>(numel) / n);
      shard2 += chunk;
      largest = std::max(largest, static_cast<double>(numel));
      largest_padded = std::max(largest_padded, chunk * n);
    }
    StrategyMemory& m = out[static_cast<int>(Strategy::zero2)];
    m.gradients = (shard2 + largest_padded + largest) * b.gradients;
    m.master = shard2 * b.master;
    m.optimizer = shard2 * b.optimizer;
  }
  return out;
}

namespace {

// The gradient all-reduce's time per step at the given (or measured) bus bandwidth; nothing without one.
void print_all_reduce_estimate(const PlanArgs& a, int64_t params, const BytesPerParam& b) {
  double bus_gbps = a.bus_gbps;
  std::string bus_source = "given";
  if (a.measure_bus) {
    const CollectiveSmoke s =
        local_all_reduce_smoke(static_cast<int>(system_info().gpus.size()), std::chrono::seconds(60));
    if (!s.correct)
      throw std::runtime_error("--bus-bandwidth measure: the all-reduce smoke test failed: " + s.error +
                               "\nHINT: `trainer doctor` runs the same test; or pass --bus-bandwidth GB/s");
    bus_gbps = s.timings.back().bus_gb_per_s;
    bus_source = "measured: " + s.backend + " all-reduce of " + std::to_string(s.timings.back().bytes >> 20) +
                 " MiB across " + std::to_string(s.ranks) + " local ranks";
  }
  if (bus_gbps > 0) {
    const double grad_bytes = static_cast<double>(params) * b.gradients;
    const double seconds = 2.0 * (a.procs - 1) / a.procs * grad_bytes / (bus_gbps * 1e9);
    std::printf(
        "\nall-reduce of %s of gradients per step at %.3g GB/s bus bandwidth (%s; ring, 2(N-1)/N x bytes / "
        "bandwidth): %.2f ms\n",
        mib(grad_bytes).c_str(), bus_gbps, bus_source.c_str(), seconds * 1e3);
  }
}

}  // namespace

namespace {

// The header lines: the run planned, the parameters, the bytes per parameter and the measured activations.
void print_inputs(const PlanArgs& a, const Config& config, const std::string& note, const DryRun& r,
                  const BytesPerParam& b) {
  const std::string precision(precision_name(config.train.precision));
  std::printf("plan: %s, model %s, %d rank%s, batch %d/rank, precision %s, optimizer %s\n",
              a.config_path.c_str(), config.model.name.c_str(), a.procs, a.procs == 1 ? "" : "s",
              config.data.batch_size, precision.c_str(), setting_name(config.optim.name).c_str());
  if (!note.empty()) std::printf("note: %s\n", note.c_str());
  std::printf("parameters: %s\n", with_commas(r.params).c_str());
  std::printf(
      "bytes per parameter: weights %d, gradients %d, fp32 master %d, optimizer state %d (%s), total %d\n",
      b.weights, b.gradients, b.master, b.optimizer,
      b.optimizer == 8 ? "2 moments" : (b.optimizer ? "momentum" : "SGD, no momentum"),
      b.weights + b.gradients + b.master + b.optimizer);
  std::printf(
      "activations: %s measured by a dry-run step on %s (peak %s over %s of weights, buffers and "
      "gradients)\n",
      mib(static_cast<double>(r.activation_bytes)).c_str(), r.device.c_str(),
      mib(static_cast<double>(r.peak_bytes)).c_str(), mib(static_cast<double>(r.baseline_bytes)).c_str());
  if (r.ema_bytes > 0)
    std::printf(
        "ema copy: %s bytes (ema.enabled: the weight average's parameters and buffers, whole on every "
        "rank)\n",
        with_commas(r.ema_bytes).c_str());
}

// The dry run's activations as the estimate for the configured precision: the CPU measures fp32 only,
// so a half precision is estimated at half of them.
int64_t estimated_activations(const Config& config, const DryRun& r) {
  int64_t activations = r.activation_bytes;
  const bool half = precision_policy_for(config.train.precision).half();
  if (half && r.device == "cpu") {
    activations /= 2;
    std::printf("note: the CPU computes in fp32 only; activations halved to %s as the estimate for %s\n",
                mib(static_cast<double>(activations)).c_str(),
                std::string(precision_name(config.train.precision)).c_str());
  }
  return activations;
}

// The per-rank memory table (an "ema copy" column with ema.enabled), the config's own stage marked, and
// its optimizer state and total in bytes.
void print_strategy_table(const std::vector<StrategyMemory>& rows, int procs, int stage) {
  const bool ema = rows[0].ema > 0;
  std::printf("\nper-rank memory at %d rank%s:\n%-8s %12s %12s %12s %14s %12s", procs, procs == 1 ? "" : "s",
              "strategy", "weights", "gradients", "fp32 master", "optim state", "activations");
  if (ema) std::printf(" %12s", "ema copy");
  std::printf(" %12s\n", "total");
  for (const StrategyMemory& m : rows) {
    std::printf("%-8s %12s %12s %12s %14s %12s", m.name.c_str(), mib(m.weights).c_str(),
                mib(m.gradients).c_str(), mib(m.master).c_str(), mib(m.optimizer).c_str(),
                mib(m.activations).c_str());
    if (ema) std::printf(" %12s", mib(m.ema).c_str());
    std::printf(" %12s%s\n", mib(m.total()).c_str(),
                static_cast<int>(m.strategy) == stage ? "  <- dist.zero_stage" : "");
  }
  // In bytes, to compare with what `trainer train` logs at start-up ("optimizer state N bytes on this
  // rank"): the same count, padding included.
  std::printf(
      "\ndist.zero_stage = %d (%s): optimizer state %s bytes per rank, %s unsharded; total %s bytes "
      "per rank\n",
      stage, rows[stage].name.c_str(), with_commas(std::llround(rows[stage].optimizer)).c_str(),
      with_commas(std::llround(rows[0].optimizer)).c_str(),
      with_commas(std::llround(rows[stage].total())).c_str());
}

// The simplest strategy that fits the device memory (--device-memory, else the GPU's) with 10% headroom.
void print_recommendation(const PlanArgs& a, const DryRun& r, const std::vector<StrategyMemory>& rows) {
  double memory = a.device_memory_gib * 1024.0 * 1024.0 * 1024.0;
  std::string memory_source = "--device-memory";
  if (memory == 0 && r.device.rfind("cuda", 0) == 0) {
    if (const std::optional<int64_t> total = runtime::device_total_memory()) {
      memory = static_cast<double>(*total);
      memory_source = "the GPU's memory";
    }
  }
  if (memory == 0) {
    std::printf("\nrecommendation: give --device-memory GiB to get one\n");
    return;
  }
  const double usable = memory * 0.9;
  for (const StrategyMemory& m : rows) {
    if (m.total() <= usable) {
      std::printf("\nrecommendation: %s (%s per rank fits %s of %.3g GiB, %s, with 10%% headroom)\n",
                  m.name.c_str(), mib(m.total()).c_str(), mib(usable).c_str(),
                  memory / (1024.0 * 1024 * 1024), memory_source.c_str());
      return;
    }
  }
  std::printf(
      "\nrecommendation: none fits %s (%.3g GiB less 10%% headroom); even ZeRO-3 needs %s per rank. HINT: a "
      "smaller data.batch_size with train.grad_accum_steps to keep the global batch, activation "
      "checkpointing (not implemented yet), or more ranks\n",
      mib(usable).c_str(), memory / (1024.0 * 1024 * 1024), mib(rows.back().total()).c_str());
}

}  // namespace

int plan_command(const std::vector<std::string>& args) {
  const PlanArgs a = parse_plan_args(args);
  if (a.help) {
    std::cout << kPlanUsage;
    return 0;
  }
  const Config config = load_config(a.config_path, a.overrides);
  std::string note;
  const Config dry = dry_run_config(config, &note);
  const DryRun r = dry_run(dry);
  const BytesPerParam b = bytes_per_param(config.optim.name, config.optim.momentum);
  print_inputs(a, config, note, r, b);
  const int64_t activations = estimated_activations(config, r);
  const std::vector<StrategyMemory> rows =
      strategy_memory(r.params, b, activations, a.procs, r.buckets, r.ema_bytes);
  print_strategy_table(rows, a.procs, config.dist.zero_stage);
  print_all_reduce_estimate(a, r.params, b);
  print_recommendation(a, r, rows);
  return 0;
}

}  // namespace trainer
