#include "app/train_loop.h"

#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "app/build_info.h"
#include "app/checkpoint.h"
#include "app/device_setup.h"
#include "app/divergence.h"
#include "app/evaluate.h"
#include "app/experiment.h"
#include "app/format.h"
#include "app/host_readback.h"
#include "app/loader_workers.h"
#include "app/phase_clock.h"
#include "app/run_start.h"
#include "app/step_graph.h"
#include "app/summary.h"
#include "app/train_signals.h"
#include "app/train_step.h"
#include "data/device_prefetcher.h"
#include "data/distributed_sampler.h"
#include "data/loader.h"
#include "dist/bn_stats.h"
#include "dist/consistency.h"
#include "dist/gradient_reducer.h"
#include "dist/process_group.h"
#include "dist/sync_batch_norm.h"
#include "dist/zero_optimizer.h"
#include "metrics/exporter.h"
#include "metrics/gpu_utilization.h"
#include "metrics/log.h"
#include "metrics/output_file.h"
#include "metrics/step_timer.h"
#include "nn/amp/loss_scaler.h"
#include "nn/safetensors.h"
#ifdef TRAINER_WITH_CUDA
#include "nn/cuda/caching_allocator.h"
#endif

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

// Train-step bookkeeping for the progress display and the per-step CSV.
struct StepLog {
  OutputFile csv;  // train_steps.csv, open on rank 0 only
  double window_loss = 0.0;
  int window_steps = 0;
};

// Rank 0's phase seconds per optimizer step, for `trainer bench`. StepTimes count this process's
// steps from 1, so a resumed run numbers them after the checkpoint's step.
struct StepTimesCsv {
  OutputFile file;  // open on rank 0 only
  int64_t first_step = 0;
};

StepTimesCsv open_step_times_csv(const std::string& run_dir, int64_t first_step, bool writer, Log& log,
                                 const FullDiskHook& full_disk) {
  StepTimesCsv csv;
  csv.first_step = first_step;
  if (writer) {
    const std::string path = run_dir + "/step_times.csv";
    std::string header = "step,step_seconds";
    for (Phase p : kAllPhases)
      if (p != Phase::step) header += "," + std::string(phase_name(p)) + "_seconds";
    bool fresh = first_step == 0 || !std::filesystem::exists(path);
    if (!fresh) {
      std::string existing;
      std::ifstream in(path);
      std::getline(in, existing);
      if (existing.empty() || std::isdigit(static_cast<unsigned char>(existing[0]))) {
        // Its header never reached the disk (a kill, a damaged file): nothing differs. truncate_step_csv
        // below writes the header and keeps the rows that have its columns.
        log.line("step_times.csv: its header is missing; writing it again");
      } else if (existing != header) {
        // A run resumed by a trainer with other phases (columns) starts the file again: appended rows
        // would not match its header.
        log.line("step_times.csv: its columns differ from this trainer's phases; starting it again");
        fresh = true;
      }
    }
    if (!fresh) truncate_step_csv(path, first_step, header, full_disk);
    csv.file.open(path, fresh ? OutputFile::Mode::truncate : OutputFile::Mode::append, full_disk);
    if (fresh) csv.file.write(header + '\n');
  }
  return csv;
}

// The largest of one integer over all ranks (no communication at world size 1).
int64_t max_over_ranks(ProcessGroup& pg, int64_t local) {
  if (pg.world_size() == 1) return local;
  Tensor value = Tensor::from_vector<int64_t>({local}, {1});
  pg.comm().all_reduce(value, ReduceOp::max);
  return static_cast<int64_t>(value.item());
}

// ---- the loop

// What the epochs share: the run's objects, which run_training sets up and owns, and the loop's own
// state, which the functions below read and update.
struct TrainLoop {
  const Config& config;
  const TrainOptions& options;
  Experiment& e;
  ProcessGroup& pg;
  Log& log;
  Exporter& exporter;
  StepTimer& timer;
  Heartbeat* heartbeat;  // tells the other ranks where this one is, for their errors; null at world size 1
  CheckpointManager& checkpoints;
  LossScaler& scaler;
  ZeroOptimizer* zero;  // dist.zero_stage > 0; null otherwise
  DistributedSampler& sampler;
  StepContext& step;  // what train_step works with
  const std::string& run_dir;
  const std::string& ckpt_dir;
  const std::string& config_toml;
  bool writer;             // rank 0: writes checkpoints, the summary and the shared files
  bool average_bn_stats;   // without SyncBN: average the ranks' BN running statistics before eval/checkpoints
  SignalHook signal_hook;  // test hooks TRAINER_TEST_SIGTERM_AT_STEP, _SIGNAL, _SIGNAL_TWICE
  FullDiskHook full_disk;  // test hook TRAINER_TEST_FULL_DISK (metrics/output_file.h)

  TrainingState st;
  StepLog steps;  // rank 0's losses only (each rank's loss is of its own shard; the weights are the same)
  StepTimesCsv step_times;
  RunSummary summary;
  bool done = false;                     // the run has reached total_steps or the target accuracy
  int stop_signal = 0;                   // the signal all ranks agreed to stop on; 0 = none
  std::function<double()> pending_stop;  // GPUs: the last step's stop-signal agreement, still on its way
  int64_t skipped_steps_reported = 0;    // a device loss scaler's skipped steps logged so far
  // GPUs at world size > 1: the one-element flag the agreement reduces, kept for the run. Refilling it
  // is safe: the next fill queues on the compute stream behind the read-back copy of the last value.
  Tensor stop_flag;
  StepFence fence;  // GPUs: the host stays at most one step ahead of the device
  // train.cuda_graph: the captured step (step.graph points to it); null when every step runs eagerly.
  // Owned here so that it goes before the process group (leave_process_group).
  std::unique_ptr<StepGraph> step_graph;
};

// The orderly end of a rank's part in the job. A CUDA graph that captured NCCL collectives holds
// references on the communicator (NCCL 2.26 and later) until it is destroyed, and ncclCommFinalize
// waits for them: the graph goes first, or shutdown() would wait out the collective timeout.
void leave_process_group(TrainLoop& loop) {
  loop.step.graph = nullptr;
  loop.step_graph.reset();
  loop.pg.shutdown();
}

// Where the epoch in progress started, for its rate, ETA and train_seconds.
struct EpochProgress {
  Clock::time_point start;
  double seconds_before = 0.0;  // st.train_seconds at the epoch's start
  int64_t samples_before = 0;   // st.samples_seen at the epoch's start
  int64_t steps = 0;            // optimizer steps this process ran in the epoch
};

// A resolved step's phase times: to the exporter, and to rank 0's step_times.csv.
void observe_step(TrainLoop& loop, const StepTimes& t) {
  loop.exporter.observe_step(t);
  OutputFile& csv = loop.step_times.file;
  if (!csv.is_open()) return;
  std::string row = std::to_string(loop.step_times.first_step + t.step) + ',' + fmt("%.9g", t[Phase::step]);
  for (Phase p : kAllPhases)
    if (p != Phase::step) row += ',' + fmt("%.9g", t[p]);
  csv.write(row + '\n');
}

// The per-step CSVs on disk up to the step reached (fsynced): a checkpoint is followed by rows of
// every step it holds, so that a run killed after it (SIGKILL, a node failure) resumes with complete
// CSVs. A failed write (a full disk) stops the run, naming the file.
void sync_step_csvs(TrainLoop& loop) {
  for (const StepTimes& t : loop.timer.flush()) observe_step(loop, t);  // a device clock's lagging steps
  loop.steps.csv.sync();
  loop.step_times.file.sync();
}

// Every rank must stop at the same step, or the ones still training wait forever: a stop signal
// seen by any rank is agreed on with one tiny all-reduce (max) per step. On the CPU the host waits
// for it, timed as all-reduce (total and exposed). On GPUs it runs on the device like the gradients'
// and its result comes back one step later (loop.pending_stop): every rank reads the same value after
// the same step, so all stop together, one step after the signal, and the host never waits for the
// device in between.
int agreed_stop_signal(TrainLoop& loop) {
  if (loop.pg.world_size() == 1) return stop_requested();
  if (loop.step.device.is_cuda()) {
    const int agreed = loop.pending_stop ? static_cast<int>(loop.pending_stop()) : 0;
    if (!loop.stop_flag.defined()) loop.stop_flag = Tensor::zeros({1}, DType::f32, loop.step.device);
    loop.stop_flag.fill_(static_cast<double>(stop_requested()));
    loop.pg.comm().all_reduce(loop.stop_flag, ReduceOp::max);
    loop.pending_stop = loop.step.readback.read_later(loop.stop_flag);
    return agreed;
  }
  loop.timer.begin(Phase::allreduce_total, Timeline::compute);
  loop.timer.begin(Phase::allreduce_exposed);
  const int signal = static_cast<int>(max_over_ranks(loop.pg, stop_requested()));
  loop.timer.end(Phase::allreduce_exposed);
  loop.timer.end(Phase::allreduce_total);
  return signal;
}

// The agreement launched after an epoch's last step, read at the epoch's end (0 when none is pending).
int pending_stop_signal(TrainLoop& loop) {
  if (!loop.pending_stop) return 0;
  const int agreed = static_cast<int>(loop.pending_stop());
  loop.pending_stop = nullptr;
  return agreed;
}

// Only rank 0 writes; the others wait for it, so no rank runs ahead of a checkpoint in progress.
void save_checkpoint(TrainLoop& loop, bool final) {
  Experiment& e = loop.e;
  ProcessGroup& pg = loop.pg;
  TrainingState& st = loop.st;
  if (loop.average_bn_stats) average_bn_running_stats(*e.model, pg.comm());
  if (loop.zero) loop.zero->gather_state();  // the full optimizer state, for rank 0 to write
  st.loss_scale = loop.scaler.scale();
  st.loss_scale_growth_tracker = loop.scaler.growth_tracker();
  if (loop.writer) {
    const std::string dropout_state = e.dropout_generator->state();
    st.rng_states.assign(pg.world_size(), dropout_state);
    try {
      if (Heartbeat* h = pg.heartbeat()) h->set_phase("checkpoint");
      const std::string path = loop.checkpoints.save(*e.model, *e.optimizer, st, loop.config_toml);
      loop.log.line("checkpoint: " + path);
    } catch (const CheckpointError& err) {
      // The previous checkpoints are intact; by default a periodic failure (full disk, say) must not
      // kill hours of training (checkpoint.on_error), but the final one must not fail silently.
      if (final || loop.config.checkpoint.on_error == "stop") throw;
      loop.log.error(std::string("warning: ") + err.what() +
                     "; earlier checkpoints are intact, training continues");
    }
  }
  if (Heartbeat* h = pg.heartbeat()) h->set_phase("barrier after the checkpoint");
  pg.comm().barrier();
}

// checkpoint.every_steps: a checkpoint inside the epoch (none after the last step: the final one
// follows).
bool checkpoint_due_at_step(const TrainLoop& loop) {
  const int64_t every = loop.config.checkpoint.every_steps;
  return !loop.done && every > 0 && loop.st.step % every == 0;
}

void save_checkpoint_at_step(TrainLoop& loop) {
  sync_step_csvs(loop);
  loop.st.accuracy = -1;
  save_checkpoint(loop, false);
}

// checkpoint.every_epochs: a checkpoint after the epoch's evaluation, resuming at the next epoch.
void maybe_checkpoint_at_epoch_end(TrainLoop& loop, int epoch) {
  const bool periodic =
      loop.config.checkpoint.every_epochs > 0 && (epoch + 1) % loop.config.checkpoint.every_epochs == 0;
  if (!loop.done && periodic) {
    sync_step_csvs(loop);
    ++loop.st.epoch;  // the checkpoint resumes at the next epoch
    save_checkpoint(loop, false);
    --loop.st.epoch;
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
void count_step(TrainLoop& loop, const StepResult& result, EpochProgress& progress) {
  const Experiment& e = loop.e;
  TrainingState& st = loop.st;
  Exporter& exporter = loop.exporter;
  [[maybe_unused]] const Device& device = loop.step.device;  // read by the CUDA build only
  ++st.step;
  ++progress.steps;
  if (loop.heartbeat) loop.heartbeat->set_step(st.step);
  exporter.add_step(result.samples);
  exporter.set_learning_rate(result.lr);
  exporter.set_bad_samples_total(e.data.train->skipped_samples());
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) {
    const CudaMemoryStats mem = cuda_memory_stats();
    exporter.set_device_memory({mem.allocated_bytes, mem.reserved_bytes, mem.peak_allocated_bytes});
  }
#endif
}

// Its loss is known: stop if it is not finite, then report it (exporter, rank 0's train_steps.csv, the
// epoch's loss sum, the progress display on a terminal or a log line every log_every_steps).
void report_step(TrainLoop& loop, int64_t step, int epoch, double loss, double lr, EpochProgress& progress) {
  const Config& config = loop.config;
  const Experiment& e = loop.e;
  TrainingState& st = loop.st;
  StepLog& steps = loop.steps;
  Exporter& exporter = loop.exporter;
  Log& log = loop.log;
  check_loss_is_finite(loss, step, epoch, lr);
  exporter.set_loss(loss);
  steps.csv.write(std::to_string(step) + ',' + std::to_string(epoch + 1) + ',' + fmt("%.9g", loss) + ',' +
                  fmt("%.9g", lr) + '\n');
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
    log.line(status + " | " + loop.timer.summary());
    // What is written so far reaches the kernel now, so that a full disk is noticed within a log line.
    steps.csv.flush();
    loop.step_times.file.flush();
    steps.window_loss = 0.0;
    steps.window_steps = 0;
  }
}

// A device loss scaler's outcome of a step, now on the host: a skipped step is logged and counted as
// the host scaler does it at once.
void report_loss_scale(TrainLoop& loop, int64_t step, double skipped_steps, double loss_scale) {
  const int64_t skipped = static_cast<int64_t>(skipped_steps) - loop.skipped_steps_reported;
  if (skipped > 0) {
    loop.exporter.add_skipped_steps(skipped);
    loop.log.line(fmt("step %lld: inf/NaN gradients, step skipped; loss scale now %g",
                      static_cast<long long>(step), loss_scale));
    loop.skipped_steps_reported += skipped;
  }
  loop.exporter.set_loss_scale(loss_scale);
}

// Reports a pending step, if any (before anything that reads the losses: a checkpoint, the epoch's end).
void report_pending(TrainLoop& loop, std::optional<PendingReport>& pending, EpochProgress& progress) {
  if (!pending) return;
  const PendingReport p = std::move(*pending);
  pending.reset();
  if (p.skipped_steps) report_loss_scale(loop, p.step, p.skipped_steps(), p.loss_scale());
  report_step(loop, p.step, p.epoch, p.loss(), p.lr, progress);
}

// The loader options of one epoch, starting at its micro-batch `first_batch` (a resumed epoch).
LoaderOptions epoch_loader_options(const Config& config, int epoch, int64_t first_batch) {
  LoaderOptions lo;
  lo.batch_size = config.data.batch_size;
  lo.drop_last = config.data.drop_last;
  lo.transforms.crop_padding = config.data.random_crop_padding;
  lo.transforms.horizontal_flip = config.data.hflip;
  lo.seed = static_cast<uint64_t>(config.train.seed);
  lo.epoch = epoch;
  lo.num_workers = config.data.workers < 0 ? default_loader_workers(config) : config.data.workers;
  lo.queue_depth = config.data.prefetch_batches;
  lo.first_batch = first_batch;
  return lo;
}

// A stop signal ended the epoch: flush, checkpoint if checkpoint.on_signal says so, leave the process
// group in order. The caller exits with 128 + the signal.
void stop_on_signal(TrainLoop& loop) {
  sync_step_csvs(loop);
  loop.log.error(
      fmt("received signal %d at step %lld", loop.stop_signal, static_cast<long long>(loop.st.step)) +
      (loop.config.checkpoint.on_signal ? ": writing a checkpoint before exiting" : ": exiting"));
  if (loop.config.checkpoint.on_signal) save_checkpoint(loop, true);
  leave_process_group(loop);
}

// The epoch's train loss over every rank's batches, not rank 0's alone (one small all-reduce per
// epoch; every rank gets here, the stop signal being agreed).
double train_loss_over_ranks(TrainLoop& loop) {
  Tensor loss_sums =
      Tensor::from_vector<double>({loop.st.epoch_loss_sum, static_cast<double>(loop.st.epoch_steps)}, {2});
  if (loop.pg.world_size() > 1) loop.pg.comm().all_reduce(loss_sums, ReduceOp::sum);
  const std::vector<double> sums = loss_sums.to_vector<double>();
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

// Evaluates on the test split after the last epoch and every train.eval_every_epochs, updating the
// summary and stopping the run when train.target_accuracy is reached. Returns the epoch log line's
// evaluation part ("" without an evaluation).
std::string evaluate_at_epoch_end(TrainLoop& loop, int epoch) {
  const Config& config = loop.config;
  TrainingState& st = loop.st;
  RunSummary& summary = loop.summary;
  const bool last = loop.done || epoch + 1 == config.train.epochs;
  const int every = config.train.eval_every_epochs;
  std::string eval_part;
  st.accuracy = -1;
  if (last || (every > 0 && (epoch + 1) % every == 0)) {
    const auto eval_start = Clock::now();
    if (loop.average_bn_stats) average_bn_running_stats(*loop.e.model, loop.pg.comm());
    if (loop.heartbeat) loop.heartbeat->set_phase("evaluation");
    if (last && loop.signal_hook.in_final_eval) std::raise(loop.signal_hook.signal);
    int64_t skipped = 0;
    EvalMetrics m = evaluate(loop.e, *loop.e.data.test, &loop.pg.comm(), &skipped);
    summary.final_test_accuracy = m.top1();
    summary.final_test_top5 = m.top5();
    summary.final_test_loss = m.mean_loss();
    summary.final_test_skipped = skipped;
    st.accuracy = m.top1();
    st.best_accuracy = std::max(st.best_accuracy, m.top1());
    loop.exporter.set_eval_accuracy(m.top1());
    summary.best_test_accuracy = st.best_accuracy;
    eval_part =
        fmt(" | test loss %.4f top1 %.2f%% top5 %.2f%%", m.mean_loss(), 100 * m.top1(), 100 * m.top5());
    if (!std::isnan(m.auc())) eval_part += fmt(" auc %.4f", m.auc());
    const std::string skipped_note =
        skipped > 0 ? fmt(", %lld unreadable skipped", static_cast<long long>(skipped)) : "";
    eval_part += fmt(" (%lld images%s, %.1fs)", static_cast<long long>(m.count()), skipped_note.c_str(),
                     seconds_since(eval_start));
    // Every rank holds the same merged metrics, so every rank stops after this epoch.
    const double target = config.train.target_accuracy;
    if (target > 0 && m.top1() >= target) {
      loop.done = true;
      eval_part += fmt(" | target %.2f%% reached", 100 * target);
    }
  }
  return eval_part;
}

enum class EpochEnd {
  complete,           // the epoch's batches are all used: the next epoch starts at its first batch
  cut_short,          // the run ended inside the epoch (max_steps, or the target reached mid-epoch)
  stopped_by_signal,  // a stop signal: the run exits with 128 + loop.stop_signal
};

// One epoch, st.epoch: its steps from st.batch_in_epoch on, then the train loss over the ranks, the
// evaluation, the epoch's log line and a periodic checkpoint.
EpochEnd run_epoch(TrainLoop& loop) {
  const Config& config = loop.config;
  Experiment& e = loop.e;
  TrainingState& st = loop.st;
  const int epoch = static_cast<int>(st.epoch);
  loop.sampler.set_epoch(epoch);
  LoaderOptions lo = epoch_loader_options(config, epoch, st.batch_in_epoch);
  // data.gpu_input_pipeline: pinned batches; batch k+1 uploads on a copy stream during step k and is
  // normalised on the device. Otherwise the host normalises and the copy in train_step is synchronous.
  const Device& device = loop.step.device;
  const Device input_device = device.is_cuda() && config.data.gpu_input_pipeline ? device : Device::cpu();
  lo.allocate_batch = batch_allocator_for(input_device);
  DataLoader loader(e.data.train, loop.sampler.indices_from(st.epoch_sample_offset), lo);
  DevicePrefetcher input(loader, input_device,
                         {e.normalization.mean, e.normalization.std, loop.step.input_format});
  // Ranks that would run different numbers of steps hang in an all-reduce at the epoch's end: stop
  // here instead, naming them.
  if (loop.heartbeat) loop.heartbeat->set_phase("epoch start (step-count check)");
  check_epoch_steps(loop.pg.comm(), epoch, loader.num_batches() - lo.first_batch);

  e.model->train();
  e.optimizer->zero_grad();  // micro-batches left over by the previous epoch must not leak into this one
  EpochProgress progress{Clock::now(), st.train_seconds, st.samples_seen};
  loop.exporter.set_epoch(epoch + 1);
  std::optional<PendingReport> pending;  // the last GPU step, reported once the next one is queued
  while (!loop.done) {
    std::optional<StepResult> result = train_step(loop.step, input, st, epoch);
    if (!result) break;  // the loader ran out (a last step short of grad_accum_steps micro-batches)
    count_step(loop, *result, progress);
    report_pending(loop, pending, progress);  // its loss was read back while this step ran
    if (result->pending_loss)
      pending = PendingReport{st.step,
                              epoch,
                              result->lr,
                              std::move(result->pending_loss),
                              std::move(result->pending_skipped_steps),
                              std::move(result->pending_loss_scale)};
    else
      report_step(loop, st.step, epoch, result->loss, result->lr, progress);
    result.reset();
    if (st.step >= e.total_steps) loop.done = true;
    if (st.step == loop.signal_hook.step) {
      std::raise(loop.signal_hook.signal);  // handled before raise returns, so a second one is a true repeat
      if (loop.signal_hook.twice) std::raise(loop.signal_hook.signal);
    }
    loop.stop_signal = agreed_stop_signal(loop);
    // The step ends once the device has finished the step before it (the host stays at most one step
    // ahead), after the stop-signal agreement: step times measured on the host then add up to the
    // device's time (trainer bench's img/s come from them).
    loop.fence.step_queued(loop.step.device);
    if (auto t = loop.timer.end_step()) observe_step(loop, *t);
    if (loop.stop_signal != 0) break;
    if (checkpoint_due_at_step(loop)) {
      report_pending(loop, pending, progress);  // the checkpoint holds the epoch's loss sum
      save_checkpoint_at_step(loop);
    }
  }
  report_pending(loop, pending, progress);
  if (!loop.stop_signal) loop.stop_signal = pending_stop_signal(loop);
  st.train_seconds = progress.seconds_before + seconds_since(progress.start);
  // The epoch's collectives follow (train loss, stop, eval).
  if (loop.heartbeat) loop.heartbeat->set_phase("epoch end");
  loop.timer.discard_step();
  for (const auto& t : loop.timer.flush()) observe_step(loop, t);
  if (loop.stop_signal) {
    stop_on_signal(loop);
    return EpochEnd::stopped_by_signal;
  }
  const double epoch_seconds = seconds_since(progress.start);
  loop.summary.final_train_loss = train_loss_over_ranks(loop);
  loop.summary.epochs = epoch + 1;
  const std::string eval_part = evaluate_at_epoch_end(loop, epoch);
  loop.log.line(fmt("epoch %d/%d: train loss %.4f, %.1fs, %.0f img/s", epoch + 1, config.train.epochs,
                    loop.summary.final_train_loss, epoch_seconds,
                    (st.samples_seen - progress.samples_before) / std::max(epoch_seconds, 1e-9)) +
                eval_part);
  // The next epoch starts at its first batch with fresh loss sums.
  const bool epoch_complete = !loop.done || input.next() == std::nullopt;
  if (epoch_complete) {
    st.batch_in_epoch = 0;
    st.epoch_sample_offset = 0;
    st.epoch_loss_sum = 0.0;
    st.epoch_steps = 0;
  }
  maybe_checkpoint_at_epoch_end(loop, epoch);
  return epoch_complete ? EpochEnd::complete : EpochEnd::cut_short;
}

// After the last epoch: the final checkpoint and weights, the summary JSON, the closing log line.
// Returns the exit code: 0; 1 when train.log could not be written in full; 128 + a stop signal received
// after the last step.
int finish_run(TrainLoop& loop) {
  TrainingState& st = loop.st;
  RunSummary& summary = loop.summary;
  Log& log = loop.log;
  // A stop signal after the last step's agreement (during the final evaluation, typically) finds the
  // training complete: the final checkpoint, weights and summary are still written (seconds), and the
  // exit status 128 + the signal says that the stop was received. (Each rank reads its own signal.)
  const int late_signal = stop_requested();
  if (late_signal)
    log.error(
        fmt("received signal %d after the last step (final evaluation) at step %lld: the training is "
            "complete; writing the final checkpoint, weights and summary, then exiting with %d",
            late_signal, static_cast<long long>(st.step), 128 + late_signal));
  loop.steps.csv.close();
  loop.step_times.file.close();
  summary.steps = st.step;
  summary.train_seconds = st.train_seconds;
  summary.samples_per_second = st.samples_seen / std::max(st.train_seconds, 1e-9);
  if (loop.config.checkpoint.save_final) {
    save_checkpoint(loop, true);
    summary.weights = loop.ckpt_dir + "/final.safetensors";
    if (loop.writer) {
      save_weights(summary.weights, *loop.e.model);
      log.line("weights: " + summary.weights);
    }
  }
  if (loop.writer) {
    write_summary(loop.run_dir + "/summary.json", summary, loop.full_disk);
    if (!loop.options.summary_path.empty()) write_summary(loop.options.summary_path, summary, loop.full_disk);
  }
  leave_process_group(loop);
  const std::string skipped_note =
      summary.final_test_skipped > 0
          ? fmt(" (%lld unreadable test images skipped)", static_cast<long long>(summary.final_test_skipped))
          : "";
  log.line(fmt("done: %lld steps in %s (%.0f img/s), final test accuracy %.2f%%%s, best %.2f%%",
               static_cast<long long>(st.step), format_duration(st.train_seconds).c_str(),
               summary.samples_per_second, 100 * summary.final_test_accuracy, skipped_note.c_str(),
               100 * summary.best_test_accuracy));
  if (const std::string chance = at_chance_warning(loop.e, st.step, st.accuracy); !chance.empty())
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
  const TrainerBuild build = trainer_build();
  // ---- processes: who we are (torchrun / SLURM / OpenMPI variables) and the others
  const ProcessEnv env = process_env();
  export_nccl_settings(config);
  // The device first: NCCL needs it, and LOCAL_RANK picks it (never a silent fallback to GPU 0).
  const Device device = setup_device(config, env.local_rank);
  check_precision(config, device);
  const DistOptions dopt = dist_options(config, device, build);
  std::unique_ptr<ProcessGroup> pg = ProcessGroup::init(env, dopt);
  // A failed collective's message says where every rank was (dist/heartbeat.h).
  const DescribeRanksOnFailure describe_ranks_on_failure(pg->heartbeat());
  const int rank = pg->rank(), world = pg->world_size();
  const bool writer = rank == 0;  // only rank 0 writes checkpoints, the summary and the shared files

  const std::string run_dir = choose_run_dir(config, options, *pg, dopt);
  const std::string ckpt_dir =
      config.checkpoint.dir.empty() ? run_dir + "/checkpoints" : config.checkpoint.dir;
  if (writer) std::filesystem::create_directories(ckpt_dir);
  if (pg->store()) pg->store()->barrier("trainer/run_dir_created", rank, world, dopt.connect_timeout);
  Log& log = Log::instance();
  const std::string config_toml = config_to_toml(config);
  const FullDiskHook full_disk = full_disk_hook_from_env();
  open_run_log(log, config, env, run_dir, config_toml, rank, full_disk);

  Experiment e = build_experiment(config, device, true, world, rank);
  // SyncBN: batch statistics over all ranks (in place: the optimizer's parameters stay the same).
  if (config.model.sync_bn) convert_sync_batchnorm(*e.model, pg->comm_ptr());
  // Without SyncBN, ranks' running statistics drift apart: average them before eval and checkpoints.
  const bool average_bn_stats = !config.model.sync_bn && config.model.bn_stats_sync == "average";
  if (world > 1) check_ranks_agree(*pg, build, config_toml, e, device, env, dopt);
  // Every rank starts from rank 0's weights and buffers; gradients are averaged in buckets while
  // backward runs (nothing happens at world size 1).
  broadcast_state(pg->comm(), e.model->state_dict());
  ZeroOptimizer* zero = wrap_in_zero_optimizer(config, e, *pg, log);
  GradientReducer ddp_reducer(zero ? std::make_shared<SingleProcessComm>() : pg->comm_ptr(),
                              e.model->named_parameters());
  GradientReducer& reducer = zero && zero->gradient_reducer() ? *zero->gradient_reducer() : ddp_reducer;
  log_run_description(log, config, e, device, run_dir, build);
  const std::string workers_warning =
      loader_workers_warning(config.data.workers, env.local_world_size, std::thread::hardware_concurrency());
  if (!workers_warning.empty()) log.error(workers_warning);
  const std::string lr_note = lr_scaling_note(config, world);
  if (!lr_note.empty()) log.line(lr_note);

  // ---- observability: per-phase step times, exported per rank for Prometheus
  Exporter exporter(exporter_options(config, env, rank, build));
  if (exporter.enabled()) log.line("metrics: " + exporter.url());
  // NVML's utilisation of this rank's GPU, read once a second on a thread of its own.
  const GpuUtilization gpu_utilization(exporter.enabled() ? gpu_pci_bus_id(device) : "");
  std::optional<PeriodicReader> gpu_utilization_reader;
  if (gpu_utilization.available())
    gpu_utilization_reader.emplace([&gpu_utilization] { return gpu_utilization.read(); },
                                   [&exporter](double u) { exporter.set_gpu_utilization(u); },
                                   std::chrono::seconds(1));
  if (exporter.enabled() && device.is_cuda())
    log.line(gpu_utilization.available()
                 ? "GPU utilisation: exported from NVML (trainer_gpu_utilization_ratio)"
                 : "GPU utilisation: not exported: " + gpu_utilization.why_unavailable());
  StepTimer timer(phase_clock_for(device, pg->comm()));  // CUDA events on a GPU
  // allreduce_total: from the moment the first gradient bucket is launched (its gradients are ready on
  // the compute stream) to the end of finish() (the compute stream has waited for the last bucket).
  // Both ends on the compute timeline; on the CPU both are host times.
  bool allreduce_open = false;
  reducer.set_first_launch_observer([&] {
    timer.begin(Phase::allreduce_total, Timeline::compute);
    allreduce_open = true;
  });

  // ---- where to start: a fresh run, or exactly where a checkpoint left off
  CheckpointManager checkpoints(ckpt_dir, config.checkpoint);
  if (writer)
    for (const std::string& tmp : checkpoints.remove_stale_temps())
      log.line("checkpoint: removed " + tmp + ", left by a write that died before its rename");
  const std::string csv_path = run_dir + "/train_steps.csv";
  std::string start_point;
  TrainingState st = agreed_start(config, options, e, run_dir, ckpt_dir, log, *pg, dopt, start_point);
  if (writer) begin_step_csv(csv_path, start_point, st, full_disk);
  StepLog steps;
  if (writer) steps.csv.open(csv_path, OutputFile::Mode::append, full_disk);
  StepTimesCsv step_times = open_step_times_csv(run_dir, st.step, writer, log, full_disk);

  // fp16 needs dynamic loss scaling; every other precision runs with the scaler disabled (scale 1).
  LossScalerOptions so;
  so.enabled = config.train.precision == "fp16";
  so.init_scale = config.train.loss_scale_init;
  LossScaler scaler(so);
  const std::optional<DType> half_dtype = autocast_dtype_for(config);
  const MemoryFormat input_format = input_memory_format(config);
  if (st.loss_scale > 0) scaler.load_state(st.loss_scale, st.loss_scale_growth_tracker);
  // On a GPU the scaler decides on the device where the optimizer can skip there exactly: no step then
  // waits for the host's verdict, and the step can be captured.
  if (so.enabled && device.is_cuda()) {
    const std::string host_reason = loss_scaler_host_reason(config);
    if (host_reason.empty()) {
      // loss_scaler_host_reason() reads the config; the optimizer has the last word (step_graph_blocker
      // relies on the same config decision, so the two must agree).
      if (!e.optimizer->skips_exactly_on_device())
        throw std::logic_error("loss scaling: the config allows a device loss scaler but optimizer '" +
                               e.optimizer->name() + "' cannot skip on a device flag exactly");
      scaler.keep_on_device(device);
      e.optimizer->skip_if(scaler.found_inf_flag());
      log.line("loss scaling: on the device (skipped steps are reported one step late)");
    } else {
      log.line("loss scaling: on the host, one synchronisation per step (" + host_reason + ")");
    }
  }

  // Several GPUs: the loop's device waits can sit behind NCCL kernels that a dead peer leaves spinning;
  // they poll the communicator's failure instead of blocking in the driver.
  WaitCheck comm_failed;
  if (device.is_cuda() && world > 1) comm_failed = [&comm = pg->comm()] { comm.throw_if_failed(); };
  HostReadback readback(comm_failed);  // losses (and the stop-signal agreement) come back asynchronously
  // train.cuda_graph: full-size steps replay a CUDA graph, unless the run needs the host inside a step.
  std::unique_ptr<StepGraph> step_graph;
  if (device.is_cuda()) {
    const std::string blocker = step_graph_blocker(config, world);
    if (blocker.empty()) {
      step_graph = std::make_unique<StepGraph>(&pg->comm());
      e.optimizer->use_device_scalars();  // a replayed step reads each step's learning rate there
      log.line(std::string("CUDA graph: on: the first full-size step runs eagerly, the next is captured and "
                           "replayed") +
               (world > 1 ? " with its gradient all-reduce (each replay is one 'graph' phase, watched as "
                            "one unit by the NCCL watchdog)"
                          : ""));
    } else {
      log.line("CUDA graph: off, every step runs eagerly (" + blocker + ")");
    }
  }
  if (config.train.cudnn_fusion) log.line("cuDNN fusion: " + cudnn_fusion_state(config, device));
  if (config.train.cudnn_batchnorm) log.line("cuDNN batch norm: " + cudnn_batchnorm_state(config, device));

  const int accum = config.train.grad_accum_steps;
  const std::vector<Variable> params = e.model->parameters();
  DistributedSampler sampler(e.data.train->size(), e.world_size, rank, config.data.shuffle,
                             static_cast<uint64_t>(config.train.seed), config.data.drop_last);
  RunSummary summary;
  summary.world_size = e.world_size;
  summary.run_dir = run_dir;
  summary.best_test_accuracy = st.best_accuracy;
  const bool done = st.step >= e.total_steps;
  Heartbeat* heartbeat = pg->heartbeat();  // tells the other ranks where this one is, for their errors
  if (heartbeat) timer.set_phase_observer([heartbeat](Phase p) { heartbeat->set_phase(phase_name(p)); });

  StepContext step_context{
      .config = config,
      .e = e,
      .device = device,
      .input_format = input_format,
      .half_dtype = half_dtype,
      .accum = accum,
      .params = params,
      .reducer = reducer,
      .zero = zero,
      .scaler = scaler,
      .all_ranks_finite = [&pg = *pg](bool local) { return max_over_ranks(pg, local ? 0 : 1) == 0; },
      .agree_found_inf = world > 1 ? std::function<void(Tensor&)>([&pg = *pg](Tensor& flag) {
        pg.comm().all_reduce(flag, ReduceOp::max);
      })
                                   : std::function<void(Tensor&)>(),
      .timer = timer,
      .allreduce_open = allreduce_open,
      .exporter = exporter,
      .log = log,
      .rank = rank,
      .stall = stall_hook_from_env(),
      .inf_grad = inf_grad_hook_from_env(),
      .graph = step_graph.get(),
      .readback = readback,
  };
  TrainLoop loop{
      .config = config,
      .options = options,
      .e = e,
      .pg = *pg,
      .log = log,
      .exporter = exporter,
      .timer = timer,
      .heartbeat = heartbeat,
      .checkpoints = checkpoints,
      .scaler = scaler,
      .zero = zero,
      .sampler = sampler,
      .step = step_context,
      .run_dir = run_dir,
      .ckpt_dir = ckpt_dir,
      .config_toml = config_toml,
      .writer = writer,
      .average_bn_stats = average_bn_stats,
      .signal_hook = signal_hook_from_env(),
      .full_disk = full_disk,
      .st = std::move(st),
      .steps = std::move(steps),
      .step_times = std::move(step_times),
      .summary = std::move(summary),
      .done = done,
      .stop_signal = 0,
      .pending_stop = {},
      .skipped_steps_reported = 0,
      .stop_flag = {},
      .fence = StepFence(comm_failed),
      .step_graph = std::move(step_graph),
  };

  // From here a stop signal is the loop's to handle (finish the step, checkpoint): the store's waits
  // (the checkpoint's barriers among them) must run to their end.
  set_store_wait_interrupt(nullptr);
  for (; loop.st.epoch < config.train.epochs && !loop.done; ++loop.st.epoch) {
    const EpochEnd end = run_epoch(loop);
    if (end == EpochEnd::stopped_by_signal) return 128 + loop.stop_signal;
    if (end == EpochEnd::cut_short) break;  // max_steps ended the run inside this epoch
  }
  return finish_run(loop);
}

}  // namespace trainer
