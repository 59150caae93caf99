#include "app/train/train_loop.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "app/common/format.h"
#include "app/run/augmentation.h"
#include "app/run/checkpoint.h"
#include "app/run/datasets.h"
#include "app/run/evaluate.h"
#include "app/run/experiment.h"
#include "app/run/loader_workers.h"
#include "app/run/model_card.h"
#include "app/run/run_directory.h"
#include "app/train/divergence.h"
#include "app/train/frozen_epochs.h"
#include "app/train/host_readback.h"
#include "app/train/step_graph.h"
#include "app/train/summary.h"
#include "app/train/train_signals.h"
#include "app/train/train_step.h"
#include "app/train/training_run.h"
#include "data/device_prefetcher.h"
#include "data/distributed_sampler.h"
#include "data/loader.h"
#include "dist/bn_stats.h"
#include "dist/consistency.h"
#include "dist/gradient_reducer.h"
#include "dist/process_group.h"
#include "metrics/exporter.h"
#include "metrics/log.h"
#include "metrics/output_file.h"
#include "metrics/run_csv.h"
#include "metrics/step_timer.h"
#include "nn/amp/loss_scaler.h"
#include "nn/runtime.h"
#include "nn/safetensors.h"

namespace trainer {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string format_duration(double s) {
  char buf[32];
  const long t = std::lround(s);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

// The orderly end of a rank's part in the job. A CUDA graph that captured NCCL collectives holds
// references on the communicator (NCCL 2.26 and later) until it is destroyed, and ncclCommFinalize
// waits for them: the graph goes first, or shutdown() would wait out the collective timeout.
void leave_process_group(TrainingRun& run) {
  run.step.graph.reset();
  run.processes.group->shutdown();
}

// Where the epoch in progress started, for its rate, ETA and train_seconds.
struct EpochProgress {
  Clock::time_point start;
  double seconds_before = 0.0;  // st.train_seconds at the epoch's start
  int64_t samples_before = 0;   // st.samples_seen at the epoch's start
  int64_t steps = 0;            // optimizer steps this process ran in the epoch
  int64_t batches = 0;          // the epoch's micro-batches in the loader (the ones before a resume too)
};

// A resolved step's phase times: to the exporter, and to rank 0's step_times.csv.
void observe_step(Reporter& reporter, const StepTimes& t) {
  reporter.exporter->observe_step(t);
  OutputFile& csv = reporter.step_times.file;
  if (!csv.is_open()) return;
  std::string row =
      std::to_string(reporter.step_times.first_step + t.step) + ',' + fmt("%.9g", t[Phase::step]);
  for (Phase p : kAllPhases)
    if (p != Phase::step) row += ',' + fmt("%.9g", t[p]);
  csv.write(row + '\n');
}

// The per-step CSVs on disk up to the step reached (fsynced): a checkpoint is followed by rows of
// every step it holds, so that a run killed after it (SIGKILL, a node failure) resumes with complete
// CSVs. A failed write (a full disk) stops the run, naming the file.
void sync_step_csvs(Reporter& reporter) {
  for (const StepTimes& t : reporter.timer->flush())
    observe_step(reporter, t);  // a device clock's lagging steps
  reporter.steps.csv.sync();
  reporter.step_times.file.sync();
}

// Every rank must stop at the same step, or the ones still training wait forever: a stop signal
// seen by any rank is agreed on with one tiny all-reduce (max) per step. On the CPU the host waits
// for it, timed as all-reduce (total and exposed). On GPUs it runs on the device like the gradients'
// and its result comes back one step later (run.loop.pending_stop): every rank reads the same value after
// the same step, so all stop together, one step after the signal, and the host never waits for the
// device in between.
int agreed_stop_signal(TrainingRun& run) {
  if (run.processes.group->world_size() == 1) return stop_requested();
  if (run.context.device.is_cuda()) {
    const int agreed = run.loop.pending_stop ? static_cast<int>(run.loop.pending_stop()) : 0;
    if (!run.loop.stop_flag.defined())
      run.loop.stop_flag = Tensor::zeros({1}, DType::f32, run.context.device);
    run.loop.stop_flag.fill_(static_cast<double>(stop_requested()));
    run.processes.group->comm().all_reduce(run.loop.stop_flag, ReduceOp::max);
    run.loop.pending_stop = run.step.readback->read_later(run.loop.stop_flag);
    return agreed;
  }
  run.reporter.timer->begin(Phase::allreduce_total, Timeline::compute);
  run.reporter.timer->begin(Phase::allreduce_exposed);
  const int signal = static_cast<int>(max_over_ranks(*run.processes.group, stop_requested()));
  run.reporter.timer->end(Phase::allreduce_exposed);
  run.reporter.timer->end(Phase::allreduce_total);
  return signal;
}

// The agreement launched after an epoch's last step, read at the epoch's end (0 when none is pending).
int pending_stop_signal(LoopState& loop) {
  if (!loop.pending_stop) return 0;
  const int agreed = static_cast<int>(loop.pending_stop());
  loop.pending_stop = nullptr;
  return agreed;
}

// A final (or at-signal) checkpoint that could not be written where configured: rank 0 writes it into
// the run directory instead, or, when that fails too, says which checkpoint on disk is the newest, so
// that the run's weights never vanish silently. Returns the message the run then stops with.
std::string rescue_final_checkpoint(TrainingRun& run, const std::string& failure) {
  const std::string rescue_dir = run.files.run_dir + "/" + kRescuedCheckpointsDir;
  std::string what = "the final checkpoint could not be written: " + failure;
  if (!same_directory(rescue_dir, run.files.ckpt_dir)) {
    try {
      CheckpointManager rescue(rescue_dir, run.context.config.checkpoint);
      const std::string path =
          rescue.save(*run.experiment.model, *run.experiment.optimizer, run.state, run.files.config_toml,
                      model_card_of(run.experiment), run.experiment.ema.get());
      return what + "; it was written to " + path + " instead. HINT: continue with --resume " + path +
             " (or --resume auto) once checkpoint.dir has room, or use its model.safetensors";
    } catch (const std::exception& e) {
      what += "; nor in the run directory: " + std::string(e.what());
    }
  }
  const long long reached = static_cast<long long>(run.state.step);
  try {
    std::vector<std::string> skipped;
    const std::optional<CheckpointInfo> newest = find_latest_checkpoint(run.files.ckpt_dir, &skipped);
    what += newest ? fmt("; the newest weights on disk are step %lld's, in %s (training reached step %lld)",
                         static_cast<long long>(newest->state.step), newest->path.c_str(), reached)
                   : fmt("; no checkpoint of this run is on disk (training reached step %lld)", reached);
  } catch (const std::exception& e) {
    what += fmt("; the checkpoints on disk could not be listed (%s; training reached step %lld)", e.what(),
                reached);
  }
  return what + ". HINT: free space in (or fix the permissions of) " + run.files.ckpt_dir +
         "; --resume auto continues from the newest checkpoint";
}

// model.bn_stats_sync = "average" for the weight average's BatchNorm statistics too, at the same points
// as the model's (evaluations and checkpoints), so every rank holds, evaluates and resumes the same
// average.
void average_ema_bn_stats(TrainingRun& run) {
  ModelEma* ema = run.experiment.ema.get();
  if (!ema || !run.data_parallel.average_bn_stats || run.processes.group->world_size() == 1) return;
  EmaWeightsScope average_in_place(*run.experiment.model, *ema);
  average_bn_running_stats(*run.experiment.model, run.processes.group->comm());
  ema->copy_from_model();
}

// Only rank 0 writes; the others wait for it, so no rank runs ahead of a checkpoint in progress. A
// checkpoint that must not fail -- the final one, or any under checkpoint.on_error = "stop" -- stops every
// rank together after the barrier (a final one after rank 0's rescue), never rank 0 alone.
void save_checkpoint(TrainingRun& run, bool final) {
  Experiment& e = run.experiment;
  ProcessGroup& pg = *run.processes.group;
  TrainingState& st = run.state;
  if (run.data_parallel.average_bn_stats) average_bn_running_stats(*e.model, pg.comm());
  average_ema_bn_stats(run);
  if (run.data_parallel.zero)
    run.data_parallel.zero->gather_state();  // the full optimizer state, for rank 0 to write
  st.loss_scale = run.step.scaler->scale();
  st.loss_scale_growth_tracker = run.step.scaler->growth_tracker();
  const bool must_succeed = final || run.context.config.checkpoint.on_error == OnCheckpointError::stop;
  std::string failure;  // rank 0: why this checkpoint stops the run
  if (run.context.writer()) {
    const std::string dropout_state = e.dropout_generator->state();
    st.rng_states.assign(pg.world_size(), dropout_state);
    try {
      if (Heartbeat* h = pg.heartbeat()) h->set_phase("checkpoint");
      const std::string path = run.checkpoints->save(*e.model, *e.optimizer, st, run.files.config_toml,
                                                     model_card_of(e), e.ema.get());
      run.reporter.log.line("checkpoint: " + path);
    } catch (const std::exception& err) {
      // The previous checkpoints are intact; by default a periodic failure (full disk, say) must not
      // kill hours of training (checkpoint.on_error), but the final one must not fail silently.
      if (final)
        failure = rescue_final_checkpoint(run, err.what());
      else if (must_succeed)
        failure = err.what();
      else
        run.reporter.log.error(std::string("warning: ") + err.what() +
                               "; earlier checkpoints are intact, training continues");
    }
  }
  if (Heartbeat* h = pg.heartbeat()) h->set_phase("barrier after the checkpoint");
  pg.comm().barrier();
  if (must_succeed && max_over_ranks(pg, failure.empty() ? 0 : 1) != 0)
    throw CheckpointError(run.context.writer()
                              ? failure
                              : "rank 0 could not write the checkpoint (its train.log says why and where "
                                "the weights are)");
  run.reporter.exporter->add_checkpoint();
}

// checkpoint.every_epochs: whether the epoch `epoch` (0-based) ends with a checkpoint.
bool epoch_checkpoint_due(const CheckpointConfig& checkpoint, int epoch) {
  return checkpoint.every_epochs > 0 && (epoch + 1) % checkpoint.every_epochs == 0;
}

// checkpoint.every_steps: a checkpoint inside the epoch. None after the run's last step (the final one
// follows), nor after an epoch's last step when checkpoint.every_epochs writes one after its evaluation:
// that one holds the same weights, resumes at the next epoch and carries the evaluation, so the step's
// would be a second full write of the same state. (If that evaluation ends the run -- train.target_accuracy
// -- or a stop signal arrives with the step, the final or at-signal checkpoint stands in for both, as it
// did for every_epochs' own: none when checkpoint.save_final or on_signal is off.)
bool checkpoint_due_at_step(const TrainingRun& run, const EpochProgress& progress, int epoch) {
  const CheckpointConfig& checkpoint = run.context.config.checkpoint;
  if (run.loop.done || checkpoint.every_steps <= 0 || run.state.step % checkpoint.every_steps != 0)
    return false;
  // Fewer micro-batches left than a step takes: the epoch's steps are done (train_step drops a remainder).
  const bool epoch_ends =
      progress.batches - run.state.batch_in_epoch < run.context.config.train.grad_accum_steps;
  return !(epoch_ends && epoch_checkpoint_due(checkpoint, epoch));
}

void save_checkpoint_at_step(TrainingRun& run) {
  sync_step_csvs(run.reporter);
  run.state.accuracy = -1;
  run.state.ema_accuracy = -1;
  save_checkpoint(run, false);
}

// checkpoint.every_epochs: a checkpoint after the epoch's evaluation, resuming at the next epoch.
void maybe_checkpoint_at_epoch_end(TrainingRun& run, int epoch) {
  if (!run.loop.done && epoch_checkpoint_due(run.context.config.checkpoint, epoch)) {
    sync_step_csvs(run.reporter);
    ++run.state.epoch;  // the checkpoint resumes at the next epoch
    save_checkpoint(run, false);
    --run.state.epoch;
  }
}

// A step whose report waits for its loss (on a GPU every step's loss, replayed or eager, is read back
// while the next step runs, so the host never waits for the device in between).
struct PendingReport {
  int64_t step = 0;  // 1-based, as counted
  int epoch = 0;     // 0-based
  double lr = 0.0;
  std::function<double()> loss;  // waits for the value
  // A loss scaler kept on the device: its skipped-step count and scale after the step (else null).
  std::function<double()> skipped_steps;
  std::function<double()> loss_scale;
};

// The step is done: count it (the loop's decisions -- max_steps, checkpoints -- depend on the count).
void count_step(TrainingRun& run, const StepResult& result, EpochProgress& progress) {
  const Experiment& e = run.experiment;
  TrainingState& st = run.state;
  Exporter& exporter = *run.reporter.exporter;
  const Device& device = run.context.device;
  ++st.step;
  ++progress.steps;
  if (run.processes.heartbeat) run.processes.heartbeat->set_step(st.step);
  exporter.add_step(result.samples);
  exporter.set_learning_rate(result.lr);
  exporter.set_bad_samples_total(e.data.train->skipped_samples());
  if (device.is_cuda()) {
    const runtime::DeviceMemoryStats mem = runtime::device_memory_stats();
    exporter.set_device_memory({mem.allocated_bytes, mem.reserved_bytes, mem.peak_allocated_bytes});
  }
}

// Its loss is known: stop if it is not finite, then report it (exporter, rank 0's train_steps.csv, the
// epoch's loss sum, the progress display on a terminal or a log line every log_every_steps).
void report_step(Reporter& reporter, const Config& config, const Experiment& e, TrainingState& st,
                 int64_t step, int epoch, double loss, double lr, EpochProgress& progress) {
  StepLog& steps = reporter.steps;
  Exporter& exporter = *reporter.exporter;
  Log& log = reporter.log;
  exporter.observe_loss(loss);  // before the check: a scrape may still see a NaN
  check_loss_is_finite(loss, step, epoch, lr);
  steps.csv.write(train_steps_row(step, epoch + 1, loss, lr, unix_seconds_now()) + '\n');
  steps.window_loss += loss;
  ++steps.window_steps;
  st.epoch_loss_sum += loss;
  ++st.epoch_steps;
  st.train_seconds = progress.seconds_before + seconds_since(progress.start);
  const double rate =
      (st.samples_seen - progress.samples_before) / std::max(seconds_since(progress.start), 1e-9);
  const double eta =
      (e.total_steps - step) *
      (e.steps_per_epoch ? seconds_since(progress.start) / std::max<int64_t>(1, progress.steps) : 0.0);
  const std::string status =
      fmt("epoch %d/%d step %lld/%lld loss %.4f lr %.4g img/s %.0f eta %s", epoch + 1, config.train.epochs,
          static_cast<long long>(step), static_cast<long long>(e.total_steps),
          steps.window_loss / steps.window_steps, lr, rate, format_duration(eta).c_str());
  exporter.set_samples_per_second(rate / e.world_size);
  // On a terminal the status line is redrawn at every step; the periodic line with the phase times is
  // logged whatever the console is (train.log must not depend on where stdout goes).
  if (log.stdout_is_terminal()) log.transient(status);
  if (step % config.train.log_every_steps == 0) {
    log.line(status + " | " + reporter.timer->summary());
    // What is written so far reaches the kernel now, so that a full disk is noticed within a log line.
    steps.csv.flush();
    reporter.step_times.file.flush();
    steps.window_loss = 0.0;
    steps.window_steps = 0;
  }
}

// A device loss scaler's outcome of a step, now on the host: a skipped step is logged and counted as
// the host scaler does it at once.
void report_loss_scale(Reporter& reporter, LoopState& loop, int64_t step, double skipped_steps,
                       double loss_scale) {
  const int64_t skipped = static_cast<int64_t>(skipped_steps) - loop.skipped_steps_reported;
  if (skipped > 0) {
    reporter.exporter->add_skipped_steps(skipped);
    reporter.log.line(fmt("step %lld: inf/NaN gradients, step skipped; loss scale now %g",
                          static_cast<long long>(step), loss_scale));
    loop.skipped_steps_reported += skipped;
  }
  reporter.exporter->set_loss_scale(loss_scale);
}

// Reports a pending step, if any (before anything that reads the losses: a checkpoint, the epoch's end).
void report_pending(TrainingRun& run, std::optional<PendingReport>& pending, EpochProgress& progress) {
  if (!pending) return;
  const PendingReport p = std::move(*pending);
  pending.reset();
  if (p.skipped_steps) report_loss_scale(run.reporter, run.loop, p.step, p.skipped_steps(), p.loss_scale());
  report_step(run.reporter, run.context.config, run.experiment, run.state, p.step, p.epoch, p.loss(), p.lr,
              progress);
}

// The loader options of one epoch, starting at its micro-batch `first_batch` (a resumed epoch).
LoaderOptions epoch_loader_options(const Config& config, int local_world_size, int epoch,
                                   int64_t first_batch) {
  LoaderOptions lo;
  lo.batch_size = config.data.batch_size;
  lo.drop_last = config.data.drop_last;
  lo.transforms.crop_padding = config.data.random_crop_padding;
  lo.transforms.horizontal_flip = config.data.hflip;
  lo.transforms.augment = train_augmentation(config);
  lo.seed = static_cast<uint64_t>(config.train.seed);
  lo.epoch = epoch;
  lo.num_workers =
      config.data.workers < 0 ? default_loader_workers(config, local_world_size) : config.data.workers;
  lo.queue_depth = config.data.prefetch_batches;
  lo.first_batch = first_batch;
  return lo;
}

// A stop signal ended the epoch: flush, checkpoint if checkpoint.on_signal says so, leave the process
// group in order. The caller exits with 128 + the signal.
void stop_on_signal(TrainingRun& run) {
  sync_step_csvs(run.reporter);
  run.reporter.log.error(
      fmt("received signal %d at step %lld", run.loop.stop_signal, static_cast<long long>(run.state.step)) +
      (stop_signal_origin().empty() ? "" : " (" + stop_signal_origin() + ")") +
      (run.context.config.checkpoint.on_signal ? ": writing a checkpoint before exiting" : ": exiting"));
  if (run.context.config.checkpoint.on_signal) save_checkpoint(run, true);
  leave_process_group(run);
}

// The epoch's train loss over every rank's batches, not rank 0's alone (one small all-reduce per
// epoch; every rank gets here, the stop signal being agreed).
double train_loss_over_ranks(ProcessGroup& pg, const TrainingState& state) {
  Tensor loss_sums =
      Tensor::from_vector<double>({state.epoch_loss_sum, static_cast<double>(state.epoch_steps)}, {2});
  if (pg.world_size() > 1) pg.comm().all_reduce(loss_sums, ReduceOp::sum);
  const std::vector<double> sums = loss_sums.to_vector<double>();
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

// The weight average (ema.enabled), evaluated on the test split like the model, in its place (its
// BatchNorm statistics averaged over the ranks as the model's are), beside the model's results in the
// summary, the exporter and metrics.csv. Returns the log line's part ("" without an average).
std::string evaluate_ema(TrainingRun& run, EvalCells& cells) {
  const ModelEma* ema = run.experiment.ema.get();
  if (!ema) return "";
  TrainingState& st = run.state;
  RunSummary& summary = run.reporter.summary;
  Comm& comm = run.processes.group->comm();
  const auto start = Clock::now();
  average_ema_bn_stats(run);
  EmaWeightsScope average_in_place(*run.experiment.model, *ema);
  const EvalMetrics m = evaluate(run.experiment, *run.experiment.data.test, &comm);
  st.ema_accuracy = m.top1();
  st.best_ema_accuracy = std::max(st.best_ema_accuracy, m.top1());
  summary.has_ema = true;
  summary.final_ema_test_accuracy = m.top1();
  summary.best_ema_test_accuracy = st.best_ema_accuracy;
  summary.final_ema_test_loss = m.mean_loss();
  run.reporter.exporter->set_ema_eval(m.top1(), m.top5(), m.mean_loss());
  cells.ema_loss = m.mean_loss();
  cells.ema_top1 = m.top1();
  cells.ema_top5 = m.top5();
  return fmt(" | EMA test loss %.4f top1 %.2f%% top5 %.2f%% (%.1fs)", m.mean_loss(), 100 * m.top1(),
             100 * m.top5(), seconds_since(start));
}

// Evaluates on the test split after the last epoch and every train.eval_every_epochs, updating the
// summary and stopping the run when train.target_accuracy is reached. Returns the epoch log line's
// evaluation part ("" without an evaluation).
std::string evaluate_at_epoch_end(TrainingRun& run, int epoch) {
  const Config& config = run.context.config;
  TrainingState& st = run.state;
  RunSummary& summary = run.reporter.summary;
  const bool last = run.loop.done || epoch + 1 == config.train.epochs;
  const int every = config.train.eval_every_epochs;
  std::string eval_part;
  st.accuracy = -1;
  st.ema_accuracy = -1;
  if (last || (every > 0 && (epoch + 1) % every == 0)) {
    const auto eval_start = Clock::now();
    if (run.data_parallel.average_bn_stats)
      average_bn_running_stats(*run.experiment.model, run.processes.group->comm());
    if (run.processes.heartbeat) run.processes.heartbeat->set_phase("evaluation");
    if (last && run.context.faults.signal.in_final_eval) std::raise(run.context.faults.signal.signal);
    int64_t skipped = 0;
    EvalMetrics m =
        evaluate(run.experiment, *run.experiment.data.test, &run.processes.group->comm(), &skipped);
    summary.final_test_accuracy = m.top1();
    summary.final_test_top5 = m.top5();
    summary.final_test_loss = m.mean_loss();
    summary.final_test_skipped = skipped;
    st.accuracy = m.top1();
    st.best_accuracy = std::max(st.best_accuracy, m.top1());
    run.reporter.exporter->set_eval(m.top1(), m.top5(), m.mean_loss());
    summary.best_test_accuracy = st.best_accuracy;
    eval_part =
        fmt(" | test loss %.4f top1 %.2f%% top5 %.2f%%", m.mean_loss(), 100 * m.top1(), 100 * m.top5());
    if (!std::isnan(m.auc())) eval_part += fmt(" auc %.4f", m.auc());
    const std::string skipped_note =
        skipped > 0 ? fmt(", %lld unreadable skipped", static_cast<long long>(skipped)) : "";
    eval_part += fmt(" (%lld images%s, %.1fs)", static_cast<long long>(m.count()), skipped_note.c_str(),
                     seconds_since(eval_start));
    EvalCells cells;
    cells.loss = m.mean_loss();
    cells.top1 = m.top1();
    cells.top5 = m.top5();
    cells.auc = m.auc();
    eval_part += evaluate_ema(run, cells);
    run.reporter.epoch_csv.set_eval(cells);
    // Every rank holds the same merged metrics, so every rank stops after this epoch.
    const double target = config.train.target_accuracy;
    if (target > 0 && m.top1() >= target) {
      run.loop.done = true;
      eval_part += fmt(" | target %.2f%% reached", 100 * target);
    }
  }
  return eval_part;
}

enum class EpochEnd {
  complete,           // the epoch's batches are all used: the next epoch starts at its first batch
  cut_short,          // the run ended inside the epoch (max_steps, or the target reached mid-epoch)
  stopped_by_signal,  // a stop signal: the run exits with 128 + run.loop.stop_signal
};

// The epoch's batches come from the rank's shard, from micro-batch st.batch_in_epoch on (a resumed
// epoch). data.gpu_input_pipeline: pinned batches; batch k+1 uploads on a copy stream during step k and
// is normalised on the device. Otherwise the host normalises and the copy in train_step is synchronous.
Device input_device(const RunContext& context) {
  return context.device.is_cuda() && context.config.data.gpu_input_pipeline ? context.device : Device::cpu();
}

// The epoch's steps, until the loader runs out, the run is done or a stop signal is agreed on.
void run_steps(TrainingRun& run, DevicePrefetcher& input, int epoch, EpochProgress& progress) {
  TrainingState& st = run.state;
  std::optional<PendingReport> pending;  // the last GPU step, reported once the next one is queued
  while (!run.loop.done) {
    std::optional<StepResult> result = train_step(run, input, epoch);
    if (!result) break;  // the loader ran out (a last step short of grad_accum_steps micro-batches)
    count_step(run, *result, progress);
    report_pending(run, pending, progress);  // its loss was read back while this step ran
    if (result->pending_loss)
      pending = PendingReport{st.step,
                              epoch,
                              result->lr,
                              std::move(result->pending_loss),
                              std::move(result->pending_skipped_steps),
                              std::move(result->pending_loss_scale)};
    else
      report_step(run.reporter, run.context.config, run.experiment, st, st.step, epoch, result->loss,
                  result->lr, progress);
    result.reset();
    if (st.step >= run.experiment.total_steps) run.loop.done = true;
    const SignalHook& hook = run.context.faults.signal;
    if (st.step == hook.step) {
      std::raise(hook.signal);  // handled before raise returns, so a second one is a true repeat
      if (hook.twice) std::raise(hook.signal);
    }
    run.loop.stop_signal = agreed_stop_signal(run);
    // The step ends once the device has finished the step before it (the host stays at most one step
    // ahead), after the stop-signal agreement: step times measured on the host then add up to the
    // device's time (trainer bench's img/s come from them).
    run.step.fence->step_queued(run.context.device);
    if (auto t = run.reporter.timer->end_step()) observe_step(run.reporter, *t);
    if (run.loop.stop_signal != 0) break;
    if (checkpoint_due_at_step(run, progress, epoch)) {
      report_pending(run, pending, progress);  // the checkpoint holds the epoch's loss sum
      save_checkpoint_at_step(run);
    }
  }
  report_pending(run, pending, progress);
}

// After the epoch's last step: the stop agreement still on its way, the epoch's time, the timer's
// lagging steps. The epoch's collectives follow (train loss, stop, eval).
void end_epoch_steps(TrainingRun& run, const EpochProgress& progress) {
  if (!run.loop.stop_signal) run.loop.stop_signal = pending_stop_signal(run.loop);
  run.state.train_seconds = progress.seconds_before + seconds_since(progress.start);
  if (run.processes.heartbeat) run.processes.heartbeat->set_phase("epoch end");
  run.reporter.timer->discard_step();
  for (const auto& t : run.reporter.timer->flush()) observe_step(run.reporter, t);
}

// The epoch's train loss over the ranks, its evaluation and its log line.
void summarize_epoch(TrainingRun& run, int epoch, const EpochProgress& progress) {
  const double epoch_seconds = seconds_since(progress.start);
  run.reporter.summary.final_train_loss = train_loss_over_ranks(*run.processes.group, run.state);
  run.reporter.summary.epochs = epoch + 1;
  const std::string eval_part = evaluate_at_epoch_end(run, epoch);
  run.reporter.log.line(
      fmt("epoch %d/%d: train loss %.4f, %.1fs, %.0f img/s", epoch + 1, run.context.config.train.epochs,
          run.reporter.summary.final_train_loss, epoch_seconds,
          (run.state.samples_seen - progress.samples_before) / std::max(epoch_seconds, 1e-9)) +
      eval_part);
  run.reporter.exporter->add_epoch_end();
  if (const std::string cached = data_cache_report(run.experiment.data); !cached.empty())
    run.reporter.log.line(cached);
  for (const bool training : {true, false})
    if (const FileCache* cache =
            data_cache_of(training ? run.experiment.data.train.get() : run.experiment.data.test.get()))
      run.reporter.exporter->set_data_cache(training, cache->files(), cache->bytes());
  run.reporter.epoch_csv.write_epoch(
      epoch + 1, run.state.step, run.reporter.summary.final_train_loss, run.experiment.optimizer->lr(),
      (run.state.samples_seen - progress.samples_before) / std::max(epoch_seconds, 1e-9),
      run.step.scaler->scale());
}

// This rank's indices for the epoch, from the first sample not yet dealt (a world-size change's offset).
// Repeated augmentation deals whole epochs only: its repeated list has no meaning at another world size.
std::vector<int64_t> epoch_indices(TrainingRun& run, int epoch) {
  const int64_t offset = run.state.epoch_sample_offset;
  if (!run.repeated_sampler) {
    run.sampler->set_epoch(epoch);
    return run.sampler->indices_from(offset);
  }
  if (offset != 0)
    throw std::runtime_error(
        fmt("data.repeated_augmentations: the checkpoint was written at another world size mid-epoch "
            "(offset %lld); repeated augmentation cannot re-shard an epoch. HINT: resume at the checkpoint's "
            "world size, or from an epoch-end checkpoint",
            static_cast<long long>(offset)));
  run.repeated_sampler->set_epoch(epoch);
  return run.repeated_sampler->indices();
}

// One epoch, st.epoch: its steps from st.batch_in_epoch on, then the train loss over the ranks, the
// evaluation, the epoch's log line and a periodic checkpoint.
EpochEnd run_epoch(TrainingRun& run) {
  TrainingState& st = run.state;
  const int epoch = static_cast<int>(st.epoch);
  LoaderOptions lo =
      epoch_loader_options(run.context.config, run.context.env.local_world_size, epoch, st.batch_in_epoch);
  lo.allocate_batch = batch_allocator_for(input_device(run.context));
  DataLoader loader(run.experiment.data.train, epoch_indices(run, epoch), lo);
  const Normalization& norm = run.experiment.normalization;
  DevicePrefetcher input(loader, input_device(run.context),
                         {norm.mean, norm.std, run.context.precision.input_format});
  // Ranks that would run different numbers of steps hang in an all-reduce at the epoch's end: stop
  // here instead, naming them.
  if (run.processes.heartbeat) run.processes.heartbeat->set_phase("epoch start (step-count check)");
  check_epoch_steps(run.processes.group->comm(), epoch, loader.num_batches() - lo.first_batch,
                    run.context.faults.epoch_steps.extra_steps(run.context.rank()));

  run.experiment.model->train();
  run.experiment.optimizer
      ->zero_grad();  // micro-batches left over by the previous epoch must not leak into this one
  freeze_for_epoch(run, epoch);
  EpochProgress progress{Clock::now(), st.train_seconds, st.samples_seen, 0, loader.num_batches()};
  run.reporter.exporter->set_epoch(epoch + 1);
  run_steps(run, input, epoch, progress);
  end_epoch_steps(run, progress);
  if (run.loop.stop_signal) {
    stop_on_signal(run);
    return EpochEnd::stopped_by_signal;
  }
  summarize_epoch(run, epoch, progress);
  // The next epoch starts at its first batch with fresh loss sums.
  const bool epoch_complete = !run.loop.done || input.next() == std::nullopt;
  if (epoch_complete) {
    st.batch_in_epoch = 0;
    st.epoch_sample_offset = 0;
    st.epoch_loss_sum = 0.0;
    st.epoch_steps = 0;
  }
  maybe_checkpoint_at_epoch_end(run, epoch);
  return epoch_complete ? EpochEnd::complete : EpochEnd::cut_short;
}

// After the last epoch: the final checkpoint and weights, the summary JSON, the closing log line.
// Returns the exit code: 0; 1 when train.log could not be written in full; 128 + a stop signal received
// after the last step.
int finish_run(TrainingRun& run) {
  TrainingState& st = run.state;
  RunSummary& summary = run.reporter.summary;
  Log& log = run.reporter.log;
  // A stop signal after the last step's agreement (during the final evaluation, typically) finds the
  // training complete: the final checkpoint, weights and summary are still written (seconds), and the
  // exit status 128 + the signal says that the stop was received. (Each rank reads its own signal.)
  const int late_signal = stop_requested();
  if (late_signal)
    log.error(
        fmt("received signal %d after the last step (final evaluation) at step %lld: the training is "
            "complete; writing the final checkpoint, weights and summary, then exiting with %d",
            late_signal, static_cast<long long>(st.step), 128 + late_signal));
  run.reporter.steps.csv.close();
  run.reporter.step_times.file.close();
  run.reporter.epoch_csv.close();
  summary.steps = st.step;
  summary.train_seconds = st.train_seconds;
  summary.samples_per_second = st.samples_seen / std::max(st.train_seconds, 1e-9);
  if (run.context.config.checkpoint.save_final) {
    save_checkpoint(run, true);
    summary.weights = run.files.ckpt_dir + "/final.safetensors";
    if (run.context.writer()) {
      try {
        save_weights(summary.weights, *run.experiment.model, model_card_of(run.experiment));
      } catch (const std::exception& err) {
        throw CheckpointError("weights " + summary.weights + " not written: " + err.what() +
                              "; the final checkpoint holds the same weights: " + run.files.ckpt_dir + "/" +
                              fmt("step-%08lld", static_cast<long long>(st.step)) + "/model.safetensors");
      }
      log.line("weights: " + summary.weights);
    }
  }
  if (run.context.writer()) {
    write_summary(run.files.run_dir + "/summary.json", summary, run.context.faults.full_disk);
    if (!run.context.options.summary_path.empty())
      write_summary(run.context.options.summary_path, summary, run.context.faults.full_disk);
  }
  leave_process_group(run);
  const std::string skipped_note =
      summary.final_test_skipped > 0
          ? fmt(" (%lld unreadable test images skipped)", static_cast<long long>(summary.final_test_skipped))
          : "";
  log.line(fmt("done: %lld steps in %s (%.0f img/s), final test accuracy %.2f%%%s, best %.2f%%",
               static_cast<long long>(st.step), format_duration(st.train_seconds).c_str(),
               summary.samples_per_second, 100 * summary.final_test_accuracy, skipped_note.c_str(),
               100 * summary.best_test_accuracy));
  if (const std::string chance = at_chance_warning(run.experiment, st.step, st.accuracy); !chance.empty())
    log.line("warning: " + chance);  // once: only rank 0 prints its lines
  log.close_file();
  // A failed write of train.log did not stop training (metrics/log.h); the exit status reports it.
  if (const std::string failure = log.file_failure(); !failure.empty()) {
    log.error("trainer: error: the run finished but its log is incomplete: " + failure);
    return 1;
  }
  return late_signal ? 128 + late_signal : 0;
}

}  // namespace

int run_training(const Config& config, const TrainOptions& options) {
  install_stop_handlers();
  // Until the loop takes over the stop signals (below), they end any wait for the other ranks at once.
  set_store_wait_interrupt(stop_requested);
  const std::unique_ptr<TrainingRun> run = start_run(config, options);
  // From here a stop signal is the loop's to handle (finish the step, checkpoint): the store's waits
  // (the checkpoint's barriers among them) must run to their end.
  set_store_wait_interrupt(nullptr);
  for (; run->state.epoch < config.train.epochs && !run->loop.done; ++run->state.epoch) {
    const EpochEnd end = run_epoch(*run);
    if (end == EpochEnd::stopped_by_signal) return 128 + run->loop.stop_signal;
    if (end == EpochEnd::cut_short) break;  // max_steps ended the run inside this epoch
  }
  return finish_run(*run);
}

}  // namespace trainer
