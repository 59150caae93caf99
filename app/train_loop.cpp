#include "app/train_loop.h"

#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include "app/device_setup.h"
#include "app/evaluate.h"
#include "app/experiment.h"
#include "app/summary.h"
#include "data/distributed_sampler.h"
#include "data/loader.h"
#include "data/normalize.h"
#include "metrics/log.h"
#include "nn/functional.h"
#include "nn/safetensors.h"

namespace trainer {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string format_duration(double s) {
  char buf[32];
  const long t = std::lround(s);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

std::string fmt(const char* format, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

// LOCAL_RANK picks the GPU; the data-parallel layer validates it against the rest of the environment.
int local_rank_from_env() {
  const char* v = std::getenv("LOCAL_RANK");
  return v ? std::atoi(v) : 0;
}

int default_workers() {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::max(1u, cores / 2));  // leave the other half to the math library
}

// Train-step bookkeeping for the progress display and the per-step CSV.
struct StepLog {
  std::ofstream csv;
  double window_loss = 0.0;
  int window_steps = 0;
  double epoch_loss = 0.0;
  int64_t epoch_steps = 0;
};

}  // namespace

int run_training(const Config& config, const TrainOptions& options) {
  const Device device = setup_device(config, local_rank_from_env());
  check_precision(config, device);
  const std::string run_dir =
      config.train.run_dir.empty() ? default_run_dir(config, std::time(nullptr)) : config.train.run_dir;
  const std::string ckpt_dir = config.checkpoint.dir.empty() ? run_dir + "/checkpoints" : config.checkpoint.dir;
  std::filesystem::create_directories(ckpt_dir);
  Log& log = Log::instance();
  log.open_file(run_dir + "/train.log");
  {
    std::ofstream resolved(run_dir + "/config.toml");
    resolved << config_to_toml(config);
  }
  log.line("trainer: resolved configuration (" + config.source_path + ")");
  log.line(config_table(config));

  Experiment e = build_experiment(config, device, true);
  const Dataset& train = *e.data.train;
  log.line("data:  " + train.fingerprint());
  log.line("test:  " + e.data.test->fingerprint());
  log.line(fmt("model: %s, %lld parameters; %lld steps/epoch, %lld steps, lr %.4g", config.model.name.c_str(),
               static_cast<long long>(e.model->parameter_count()), static_cast<long long>(e.steps_per_epoch),
               static_cast<long long>(e.total_steps), e.base_lr));
  log.line("device: " + device.str() + ", run directory: " + run_dir);

  DistributedSampler sampler(train.size(), e.world_size, 0, config.data.shuffle,
                             static_cast<uint64_t>(config.train.seed), config.data.drop_last);
  StepLog steps;
  steps.csv.open(run_dir + "/train_steps.csv");
  steps.csv << "step,epoch,loss,lr\n";

  const int accum = config.train.grad_accum_steps;
  const std::vector<Variable> params = e.model->parameters();
  RunSummary summary;
  summary.world_size = e.world_size;
  summary.run_dir = run_dir;
  int64_t step = 0;
  int64_t samples = 0;
  double train_seconds = 0.0;
  bool done = false;

  for (int epoch = 0; epoch < config.train.epochs && !done; ++epoch) {
    sampler.set_epoch(epoch);
    LoaderOptions lo;
    lo.batch_size = config.data.batch_size;
    lo.drop_last = config.data.drop_last;
    lo.transforms.crop_padding = config.data.random_crop_padding;
    lo.transforms.horizontal_flip = config.data.hflip;
    lo.seed = static_cast<uint64_t>(config.train.seed);
    lo.epoch = epoch;
    lo.num_workers = config.data.workers < 0 ? default_workers() : config.data.workers;
    lo.queue_depth = config.data.prefetch_batches;
    DataLoader loader(e.data.train, sampler.indices(), lo);

    e.model->train();
    steps.epoch_loss = 0.0;
    steps.epoch_steps = 0;
    const auto epoch_start = Clock::now();
    int micro = 0;
    double accum_loss = 0.0;
    while (!done) {
      // ---- data
      std::optional<Batch> batch = loader.next();
      if (!batch) break;
      Tensor images = to_float_normalized(batch->images, e.normalization.mean, e.normalization.std).to(device);
      const Tensor labels = batch->labels.to(device);
      // ---- forward
      Variable logits = (*e.model)(Variable(images));
      Variable loss = F::cross_entropy(logits, labels, config.train.label_smoothing);
      const double loss_value = loss.item();
      if (!std::isfinite(loss_value))
        throw std::runtime_error(fmt("loss is %s at step %lld (epoch %d): training diverged. HINT: lower optim.lr "
                                     "(now %.4g), add warmup (schedule.warmup_epochs) or clipping "
                                     "(optim.clip_grad_norm)",
                                     std::isnan(loss_value) ? "NaN" : "infinite", static_cast<long long>(step + 1),
                                     epoch + 1, e.optimizer->lr()));
      // ---- backward (the loss of each micro-batch counts 1/k, so k micro-batches equal one big one)
      (accum > 1 ? F::mul(loss, 1.0 / accum) : loss).backward();
      accum_loss += loss_value / accum;
      samples += batch->labels.numel();
      if (++micro % accum != 0) continue;
      // ---- optimizer
      if (config.optim.clip_grad_norm > 0) clip_grad_norm(params, config.optim.clip_grad_norm);
      const double lr = e.base_lr * e.schedule->factor(step);
      e.optimizer->set_lr(lr);
      e.optimizer->step();
      e.optimizer->zero_grad();
      ++step;
      // ---- bookkeeping
      steps.csv << step << ',' << epoch + 1 << ',' << fmt("%.9g", accum_loss) << ',' << fmt("%.9g", lr) << '\n';
      steps.window_loss += accum_loss;
      ++steps.window_steps;
      steps.epoch_loss += accum_loss;
      ++steps.epoch_steps;
      accum_loss = 0.0;
      const double elapsed = train_seconds + seconds_since(epoch_start);
      const double rate = samples / std::max(elapsed, 1e-9);
      const double eta = (e.total_steps - step) * elapsed / step;
      const std::string status =
          fmt("epoch %d/%d step %lld/%lld loss %.4f lr %.4g img/s %.0f eta %s", epoch + 1, config.train.epochs,
              static_cast<long long>(step), static_cast<long long>(e.total_steps),
              steps.window_loss / steps.window_steps, lr, rate, format_duration(eta).c_str());
      if (log.stdout_is_terminal()) log.transient(status);
      if (step % config.train.log_every_steps == 0) {
        if (!log.stdout_is_terminal()) log.line(status);
        steps.window_loss = 0.0;
        steps.window_steps = 0;
      }
      if (step >= e.total_steps) done = true;
    }
    const double epoch_seconds = seconds_since(epoch_start);
    train_seconds += epoch_seconds;
    summary.final_train_loss = steps.epoch_steps ? steps.epoch_loss / steps.epoch_steps : 0.0;
    summary.epochs = epoch + 1;

    const bool last = done || epoch + 1 == config.train.epochs;
    const int every = config.train.eval_every_epochs;
    std::string eval_part;
    if (last || (every > 0 && (epoch + 1) % every == 0)) {
      const auto eval_start = Clock::now();
      EvalMetrics m = evaluate(e, *e.data.test);
      summary.final_test_accuracy = m.top1();
      summary.final_test_top5 = m.top5();
      summary.final_test_loss = m.mean_loss();
      summary.best_test_accuracy = std::max(summary.best_test_accuracy, m.top1());
      eval_part = fmt(" | test loss %.4f top1 %.2f%% top5 %.2f%% (%lld images, %.1fs)", m.mean_loss(),
                      100 * m.top1(), 100 * m.top5(), static_cast<long long>(m.count()), seconds_since(eval_start));
    }
    log.line(fmt("epoch %d/%d: train loss %.4f, %.1fs, %.0f img/s", epoch + 1, config.train.epochs,
                 summary.final_train_loss, epoch_seconds,
                 steps.epoch_steps * config.data.batch_size * accum / std::max(epoch_seconds, 1e-9)) +
             eval_part);
  }

  summary.steps = step;
  summary.train_seconds = train_seconds;
  summary.samples_per_second = samples / std::max(train_seconds, 1e-9);
  if (config.checkpoint.save_final) {
    summary.weights = ckpt_dir + "/final.safetensors";
    save_module(summary.weights, *e.model);
    log.line("weights: " + summary.weights);
  }
  write_summary(run_dir + "/summary.json", summary);
  if (!options.summary_path.empty()) write_summary(options.summary_path, summary);
  log.line(fmt("done: %lld steps in %s (%.0f img/s), final test accuracy %.2f%%, best %.2f%%",
               static_cast<long long>(step), format_duration(train_seconds).c_str(), summary.samples_per_second,
               100 * summary.final_test_accuracy, 100 * summary.best_test_accuracy));
  log.close_file();
  return 0;
}

}  // namespace trainer
