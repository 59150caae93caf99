#include "app/train/training_run.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "app/common/format.h"
#include "app/run/device_setup.h"
#include "app/run/loader_workers.h"
#include "app/run/model_card.h"
#include "app/train/phase_clock.h"
#include "app/train/run_start.h"
#include "dist/consistency.h"
#include "dist/sync_batch_norm.h"
#include "nn/format_bytes.h"
#include "nn/runtime.h"

namespace trainer {
namespace {

// ---- who we are (torchrun / SLURM / OpenMPI variables) and the device, before connecting to the others
RunContext make_run_context(const Config& config, const TrainOptions& options) {
  const ProcessEnv env = process_env();
  export_nccl_settings(config);
  // The device first: NCCL needs it, and LOCAL_RANK picks it (never a silent fallback to GPU 0).
  const RunDevice run_device = setup_device(config, env.local_rank);  // checks the precision too
  const TrainerBuild build = trainer_build();
  return RunContext{.config = config,
                    .options = options,
                    .faults = fault_injection_from_env(),
                    .build = build,
                    .env = env,
                    .device = run_device.device,
                    .precision = run_device.precision,
                    .dist_options = dist_options(config, run_device.device, build)};
}

// ---- the other processes
void join_processes(TrainingRun& run) {
  Processes& processes = run.processes;
  processes.group = ProcessGroup::init(run.context.env, run.context.dist_options);
  // A failed collective's message says where every rank was (dist/heartbeat.h).
  processes.describe_ranks_on_failure.emplace(processes.group->heartbeat());
  processes.heartbeat = processes.group->heartbeat();
}

// Where the checkpoints go, and the key a message about that directory names.
std::string checkpoint_dir_for(const Config& config, const std::string& run_dir) {
  return config.checkpoint.dir.empty() ? run_dir + "/checkpoints" : config.checkpoint.dir;
}
const char* checkpoint_dir_setting(const Config& config) {
  return config.checkpoint.dir.empty() ? "train.run_dir" : "checkpoint.dir";
}

// Rank 0's verdict on a start-up check, given to every rank, so that all of them stop with its message
// (the others would otherwise wait for rank 0 in their next collective until it is gone). `value`: what
// rank 0 decided with it (the run directory), returned on every rank.
std::string agree_on_start_check(TrainingRun& run, const std::string& check, const std::string& problem,
                                 const std::string& value = "") {
  std::string verdict = problem, agreed = value;
  if (Store* store = run.processes.group->store(); store && run.context.world() > 1) {
    const std::string key = "trainer/start_check/" + check;
    if (run.context.writer()) {
      store->set(key + "/value", value);
      store->set(key, problem);
    } else {
      verdict = store->get(key, run.context.dist_options.connect_timeout);
      agreed = store->get(key + "/value", run.context.dist_options.connect_timeout);
      if (!verdict.empty()) verdict = "rank 0 stopped the run: " + verdict;
    }
    // Rank 0 serves the store: it leaves (and may exit) only once every rank has read the verdict.
    store->barrier(key + "/read", run.context.rank(), run.context.world(),
                   run.context.dist_options.connect_timeout);
  }
  if (!verdict.empty()) throw RunDirectoryError(verdict);
  return agreed;
}

// Rank 0: takes train.run_dir's lock; a directory the trainer named itself (a fresh timestamped one)
// that another run holds -- two runs of one config started in the same second -- gets a suffix instead.
void lock_run_directory(TrainingRun& run, const ProposedRunDir& proposed, const std::string& command) {
  for (int attempt = 1;; ++attempt) {
    run.files.run_dir = proposed.path + (attempt == 1 ? "" : "-" + std::to_string(attempt));
    create_run_directory(run.files.run_dir, "train.run_dir");
    try {
      run.files.run_dir_lock.emplace(run.files.run_dir, "train.run_dir", command);
      return;
    } catch (const RunDirectoryError&) {
      if (!proposed.fresh || attempt == 100) throw;
    }
  }
}

// Rank 0: creates the run and checkpoint directories, takes their locks and makes sure it can write in
// both, before anything else is written there.
void prepare_run_directories(TrainingRun& run, const ProposedRunDir& proposed) {
  RunFiles& paths = run.files;
  const std::string ckpt_setting = checkpoint_dir_setting(run.context.config);
  const std::string command =
      "trainer train " + run.context.config.source_path +
      (run.context.options.resume.empty() ? "" : " --resume " + run.context.options.resume);
  lock_run_directory(run, proposed, command);
  check_writable(paths.run_dir, "train.run_dir");
  paths.ckpt_dir = checkpoint_dir_for(run.context.config, paths.run_dir);
  create_run_directory(paths.ckpt_dir, ckpt_setting);
  // Its own lock too (the default <run_dir>/checkpoints included): another run's checkpoint.dir may
  // point at it.
  if (!same_directory(paths.ckpt_dir, paths.run_dir))
    run.files.ckpt_dir_lock.emplace(paths.ckpt_dir, ckpt_setting, command);
  check_writable(paths.ckpt_dir, ckpt_setting);
}

// ---- the run directory (rank 0's, agreed by all ranks), the checkpoint directory, train.log
void open_run_directory(TrainingRun& run) {
  const Config& config = run.context.config;
  RunFiles& paths = run.files;
  std::string problem;
  if (run.context.writer()) {
    try {
      prepare_run_directories(run, propose_run_dir(config, run.context.options));
    } catch (const RunDirectoryError& e) {
      problem = e.what();
    }
  }
  paths.run_dir = agree_on_start_check(run, "run_directories", problem, paths.run_dir);
  paths.ckpt_dir = checkpoint_dir_for(config, paths.run_dir);
  paths.config_toml = config_to_toml(config);
  open_run_log(run.reporter.log, config, run.context.env, paths.run_dir, paths.config_toml,
               run.context.rank(), run.context.faults.full_disk);
}

// Whether this run writes any checkpoint at all.
bool writes_checkpoints(const CheckpointConfig& c) {
  return c.save_final || c.on_signal || c.every_steps > 0 || c.every_epochs > 0;
}

// The step-<N> checkpoints already in `dir`.
int64_t checkpoints_in(const std::string& dir) {
  std::error_code ignored;
  int64_t count = 0;
  for (const auto& d : std::filesystem::directory_iterator(dir, ignored))
    if (d.is_directory(ignored) && d.path().filename().string().starts_with("step-")) ++count;
  return count;
}

// A checkpoint directory too small for this model is found out now, not at the end of the run: room
// for two checkpoints (the one being written and the one kept), one when a checkpoint is already there.
// Room for fewer than keep_last + keep_best + 1 (the most the directory holds at once, with the one
// being written) and the final weights is only warned about: the later checkpoints that fail follow
// checkpoint.on_error.
void check_checkpoint_room(TrainingRun& run) {
  std::string problem;
  const CheckpointConfig& c = run.context.config.checkpoint;
  if (run.context.writer() && writes_checkpoints(c)) {
    const int64_t one = checkpoint_bytes(*run.experiment.model, *run.experiment.optimizer,
                                         run.files.config_toml.size(), run.experiment.ema != nullptr);
    const std::string size = format_bytes(static_cast<double>(one));
    const int64_t existing = checkpoints_in(run.files.ckpt_dir);
    const std::string setting = checkpoint_dir_setting(run.context.config);
    problem = room_problem(run.files.ckpt_dir, setting, (existing > 0 ? 1 : 2) * one,
                           existing > 0
                               ? "one more checkpoint of " + size + " beside the one already there"
                               : "two checkpoints of " + size + " (the one being written and the one kept)");
    const int64_t at_once = std::max<int64_t>(1, c.keep_last + c.keep_best + 1 - existing);
    const std::string peak = room_problem(run.files.ckpt_dir, setting, at_once * one + one / 2,
                                          std::to_string(at_once) + " more checkpoints of " + size +
                                              " (checkpoint.keep_last + keep_best + the one being written)");
    if (problem.empty() && !peak.empty())
      run.reporter.log.error("warning: " + peak +
                             "; the checkpoints that do not fit will fail and follow checkpoint.on_error");
  }
  agree_on_start_check(run, "checkpoint_room", problem);
}

// ---- model, optimizer and the gradients' path, the same on every rank
void build_model(TrainingRun& run) {
  const RunContext& context = run.context;
  const Config& config = context.config;
  ProcessGroup& pg = *run.processes.group;
  DataParallel& data_parallel = run.data_parallel;
  Log& log = run.reporter.log;
  run.experiment = build_experiment(config, {context.device, context.precision}, true, context.world(),
                                    context.rank(), context.env.local_world_size);
  Experiment& e = run.experiment;
  // SyncBN: batch statistics over all ranks (in place: the optimizer's parameters stay the same).
  if (config.model.sync_bn) convert_sync_batchnorm(*e.model, pg.comm_ptr());
  // Without SyncBN, ranks' running statistics drift apart: average them before eval and checkpoints.
  data_parallel.average_bn_stats =
      !config.model.sync_bn && config.model.bn_stats_sync == BnStatsSync::average;
  if (context.world() > 1)
    check_ranks_agree(pg, context.build, run.files.config_toml, e, context.device, context.env,
                      context.dist_options);
  // Every rank starts from rank 0's weights and buffers; gradients are averaged in buckets while
  // backward runs (nothing happens at world size 1).
  broadcast_state(pg.comm(), e.model->state_dict());
  // The weight average starts from those weights; every rank keeps it whole, ZeRO or not (ZeRO's step
  // all-gathers the full parameters before the average reads them).
  e.ema = make_model_ema(config, *e.model);
  ZeroOptimizer* zero = data_parallel.zero = wrap_in_zero_optimizer(config, e, pg, log);
  // Every parameter requires a gradient here: model.freeze takes effect at the first epoch, which
  // rebuilds the reducer over the parameters that train (rebuild_gradient_reducer).
  data_parallel.ddp_reducer.emplace(zero ? std::make_shared<SingleProcessComm>() : pg.comm_ptr(),
                                    e.model->named_parameters());
  data_parallel.reducer =
      zero && zero->gradient_reducer() ? zero->gradient_reducer() : &*data_parallel.ddp_reducer;
  log_run_description(log, config, e, context.device, run.files.run_dir, context.build);
  log.line(loader_workers_reason(config, context.env.local_world_size));
  const std::string workers_warning = loader_workers_warning(
      config.data.workers, context.env.local_world_size, std::thread::hardware_concurrency());
  if (!workers_warning.empty()) log.error(workers_warning);
  const std::string lr_note = lr_scaling_note(config, context.world());
  if (!lr_note.empty()) log.line(lr_note);
}

// allreduce_total: from the moment the first gradient bucket is launched (its gradients are ready on
// the compute stream) to the end of the reduce (the compute stream has waited for the last bucket;
// run_step closes it). Both ends on the compute timeline; on the CPU both are host times.
void observe_first_bucket_launch(TrainingRun& run) {
  run.data_parallel.reducer->set_first_launch_observer(
      [&timer = *run.reporter.timer] { timer.begin(Phase::allreduce_total, Timeline::compute); });
}

// ---- observability: per-phase step times, exported per rank for Prometheus
void start_metrics(TrainingRun& run) {
  const RunContext& context = run.context;
  Reporter& reporter = run.reporter;
  reporter.exporter = std::make_unique<Exporter>(
      exporter_options(context.config, context.env, context.rank(), context.build, run.files.run_dir));
  Exporter& exporter = *reporter.exporter;
  if (exporter.enabled()) reporter.log.line("metrics: " + exporter.url());
  // NVML's utilisation of this rank's GPU, read once a second on a thread of its own.
  const GpuUtilization& gpu =
      reporter.gpu_utilization.emplace(exporter.enabled() ? gpu_pci_bus_id(context.device) : "");
  if (gpu.available())
    reporter.gpu_utilization_reader.emplace([&gpu] { return gpu.read(); },
                                            [&exporter](double u) { exporter.set_gpu_utilization(u); },
                                            std::chrono::seconds(1));
  if (exporter.enabled() && context.device.is_cuda())
    reporter.log.line(gpu.available() ? "GPU utilisation: exported from NVML (trainer_gpu_utilization_ratio)"
                                      : "GPU utilisation: not exported: " + gpu.why_unavailable());
  // CUDA events on a GPU
  reporter.timer.emplace(phase_clock_for(context.device, run.processes.group->comm()));
  observe_first_bucket_launch(run);
}

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

// checkpoint.save_initial: rank 0 writes the weights of a fresh run's first step (every rank holds them
// since broadcast_state) beside where the final weights go; a failure stops every rank now.
void write_initial_weights(TrainingRun& run) {
  const std::string path = run.files.ckpt_dir + "/initial.safetensors";
  std::string problem;
  if (run.context.writer()) {
    try {
      save_weights(path, *run.experiment.model, model_card_of(run.experiment));
      run.reporter.log.line("initial weights: " + path);
    } catch (const std::exception& err) {
      problem = "checkpoint.save_initial: " + path + " not written: " + err.what();
    }
  }
  agree_on_start_check(run, "initial_weights", problem);
}

// ---- where to start: a fresh run, or exactly where a checkpoint left off; the per-step CSVs
void choose_start(TrainingRun& run) {
  const RunFiles& paths = run.files;
  const FullDiskHook& full_disk = run.context.faults.full_disk;
  CheckpointManager& checkpoints = run.checkpoints.emplace(paths.ckpt_dir, run.context.config.checkpoint,
                                                           run.context.faults.crash_before_rename_step);
  if (run.context.writer())
    for (const std::string& tmp : checkpoints.remove_stale_temps())
      run.reporter.log.line("checkpoint: removed " + tmp + ", left by a write that died before its rename");
  const std::string csv_path = paths.run_dir + "/train_steps.csv";
  std::string start_point;
  run.state =
      agreed_start(run.context.config, run.context.options, run.experiment, paths.run_dir, paths.ckpt_dir,
                   run.reporter.log, *run.processes.group, run.context.dist_options, start_point);
  if (run.context.writer()) begin_step_csv(csv_path, start_point, run.state, full_disk);
  if (run.context.writer()) run.reporter.steps.csv.open(csv_path, OutputFile::Mode::append, full_disk);
  run.reporter.step_times =
      open_step_times_csv(paths.run_dir, run.state.step, run.context.writer(), run.reporter.log, full_disk);
  if (run.context.writer()) run.reporter.epoch_csv.open(paths.run_dir, run.state.step, full_disk);
  if (run.context.config.checkpoint.save_initial && run.state.step == 0) write_initial_weights(run);
}

// ---- fp16's dynamic loss scaling (every other precision runs with the scaler disabled, scale 1). On
// a GPU the scaler decides on the device where the optimizer can skip there exactly: no step then waits
// for the host's verdict, and the step can be captured.
void set_up_loss_scaling(TrainingRun& run) {
  LossScalerOptions so;
  so.enabled = run.context.precision.loss_scaling;
  so.init_scale = run.context.config.train.loss_scale_init;
  LossScaler& scaler = run.step.scaler.emplace(so);
  if (run.state.loss_scale > 0) scaler.load_state(run.state.loss_scale, run.state.loss_scale_growth_tracker);
  if (!so.enabled || !run.context.device.is_cuda()) return;
  if (run.context.precision.loss_scale_on_device) {
    // The policy allows a device loss scaler (as step_graph_blocker does, from the same
    // loss_scaler_host_reason); the optimizer has the last word.
    Optimizer& optimizer = *run.experiment.optimizer;
    if (!optimizer.skips_exactly_on_device())
      throw std::logic_error("loss scaling: the config allows a device loss scaler but optimizer '" +
                             optimizer.name() + "' cannot skip on a device flag exactly");
    scaler.keep_on_device(run.context.device);
    optimizer.skip_if(scaler.found_inf_flag());
    run.reporter.log.line("loss scaling: on the device (skipped steps are reported one step late)");
  } else {
    run.reporter.log.line("loss scaling: on the host, one synchronisation per step (" +
                          run.context.precision.loss_scale_host_reason + ")");
  }
}

// train.cuda_graph: full-size steps replay a CUDA graph, unless the run needs the host inside a step.
void set_up_step_graph(TrainingRun& run) {
  if (!run.context.device.is_cuda()) return;
  const std::string blocker = step_graph_blocker(run.context.config, run.context.world());
  if (!blocker.empty()) {
    run.reporter.log.line("CUDA graph: off, every step runs eagerly (" + blocker + ")");
    return;
  }
  run.step.graph = std::make_unique<StepGraph>(&run.processes.group->comm());
  run.experiment.optimizer->use_device_scalars();  // a replayed step reads each step's learning rate there
  run.reporter.log.line(
      std::string("CUDA graph: on: the first full-size step runs eagerly, the next is captured and "
                  "replayed") +
      (run.context.world() > 1 ? " with its gradient all-reduce (each replay is one 'graph' phase, watched "
                                 "as one unit by the NCCL watchdog)"
                               : ""));
}

// Mixup/CutMix and the BCE loss: the draws' tensor on the device, the loss the step forms, a log line.
void set_up_soft_targets(TrainingRun& run) {
  const Config& config = run.context.config;
  const MixSettings mix{.mixup_alpha = config.mixup.mixup_alpha,
                        .cutmix_alpha = config.mixup.cutmix_alpha,
                        .prob = config.mixup.prob,
                        .switch_prob = config.mixup.switch_prob};
  if (!mix.enabled() && config.train.loss == LossKind::cross_entropy) return;
  StepMachinery& step = run.step;
  step.mixer =
      std::make_unique<BatchMixer>(mix, static_cast<uint64_t>(config.train.seed), run.context.device);
  step.soft_loss = TrainingLoss{.kind = config.train.loss,
                                .label_smoothing = config.train.label_smoothing,
                                .draws = &step.mixer->draws(),
                                .mix_images = mix.enabled()};
  run.reporter.log.line(
      fmt("loss: %s on soft targets (label smoothing %g)%s",
          std::string(loss_kind_name(config.train.loss)).c_str(), config.train.label_smoothing,
          mix.enabled()
              ? fmt("; mixup alpha %g, cutmix alpha %g, prob %g, switch prob %g: batches mixed on the %s, "
                    "draws from (seed, step)%s",
                    mix.mixup_alpha, mix.cutmix_alpha, mix.prob, mix.switch_prob,
                    run.context.device.is_cuda() ? "GPU" : "CPU",
                    run.step.graph ? ", read on the device by the CUDA graph" : "")
                    .c_str()
              : ""));
}

// ---- the step: its parts, the losses' way back to the host, the sampler, the loop's state
void set_up_step(TrainingRun& run) {
  const RunContext& context = run.context;
  const Config& config = context.config;
  StepMachinery& step = run.step;
  Reporter& reporter = run.reporter;
  ProcessGroup& pg = *run.processes.group;
  // Several GPUs: the loop's device waits can sit behind NCCL kernels that a dead peer leaves spinning;
  // they poll the communicator's failure instead of blocking in the driver.
  if (context.device.is_cuda() && context.world() > 1)
    step.comm_failed = [&comm = pg.comm()] { comm.throw_if_failed(); };
  step.readback = std::make_unique<HostReadback>(step.comm_failed);
  set_up_step_graph(run);
  // The backend's kernel choices, set once from the precision policy (app/run/device_setup.cpp).
  if (context.device.is_cuda())
    reporter.log.line("CUDA backend: " + runtime::describe_backend_options(runtime::backend_options()));
  if (config.train.cudnn_fusion)
    reporter.log.line("cuDNN fusion: " + cudnn_fusion_state(config, context.device));
  if (config.train.cudnn_batchnorm)
    reporter.log.line("cuDNN batch norm: " + cudnn_batchnorm_state(config, context.device));
  step.params = run.experiment.model->parameters();
  set_up_soft_targets(run);
  if (auto drop_path = std::make_unique<DropPathStager>(*run.experiment.model, config.data.batch_size);
      !drop_path->empty())
    step.drop_path = std::move(drop_path);
  step.parts.emplace(StepParts{
      .model = *run.experiment.model,
      .optimizer = *run.experiment.optimizer,
      .scaler = *step.scaler,
      .reducer = run.data_parallel.reducer,
      .zero = run.data_parallel.zero,
      .params = step.params,
      .autocast = context.precision.autocast,
      .label_smoothing = config.train.label_smoothing,
      .soft_loss = step.mixer ? &step.soft_loss : nullptr,
      .clip_grad_norm = config.optim.clip_grad_norm,
      .ema = run.experiment.ema.get(),
      .accum = config.train.grad_accum_steps,
      // On the CPU a loss read costs nothing: a NaN stops the run before its update. A GPU's losses come
      // back while the next step runs (app/train/train_step.cpp).
      .check_losses_on_host = !context.device.is_cuda(),
      .all_ranks_finite = [&pg](bool local) { return max_over_ranks(pg, local ? 0 : 1) == 0; },
      .agree_found_inf = context.world() > 1 ? std::function<void(Tensor&)>([&pg](Tensor& flag) {
        pg.comm().all_reduce(flag, ReduceOp::max);
      })
                                             : std::function<void(Tensor&)>(),
  });
  run.sampler.emplace(run.experiment.data.train->size(), run.experiment.world_size, context.rank(),
                      config.data.shuffle, static_cast<uint64_t>(config.train.seed), config.data.drop_last);
  if (config.data.repeated_augmentations > 1)
    run.repeated_sampler.emplace(run.experiment.data.train->size(), run.experiment.world_size, context.rank(),
                                 config.data.shuffle, static_cast<uint64_t>(config.train.seed),
                                 config.data.repeated_augmentations);
  reporter.summary.world_size = run.experiment.world_size;
  reporter.summary.run_dir = run.files.run_dir;
  reporter.summary.best_test_accuracy = run.state.best_accuracy;
  reporter.summary.best_ema_test_accuracy = run.state.best_ema_accuracy;
  run.loop.done = run.state.step >= run.experiment.total_steps;
  if (Heartbeat* heartbeat = run.processes.heartbeat)
    reporter.timer->set_phase_observer([heartbeat](Phase p) { heartbeat->set_phase(phase_name(p)); });
  step.fence.emplace(step.comm_failed);
}

}  // namespace

void rebuild_gradient_reducer(TrainingRun& run) {
  DataParallel& data_parallel = run.data_parallel;
  if (data_parallel.zero)  // load_config refuses model.freeze with dist.zero_stage
    throw std::logic_error("rebuild_gradient_reducer: ZeRO's buckets are laid out once");
  data_parallel.ddp_reducer.emplace(run.processes.group->comm_ptr(),
                                    run.experiment.model->named_parameters());
  data_parallel.reducer = &*data_parallel.ddp_reducer;
  observe_first_bucket_launch(run);
}

int64_t max_over_ranks(ProcessGroup& pg, int64_t local) {
  if (pg.world_size() == 1) return local;
  Tensor value = Tensor::from_vector<int64_t>({local}, {1});
  pg.comm().all_reduce(value, ReduceOp::max);
  return static_cast<int64_t>(value.item());
}

TrainingRun::TrainingRun(const Config& config, const TrainOptions& options)
    : context(make_run_context(config, options)), reporter{.log = Log::instance()} {}

std::unique_ptr<TrainingRun> start_run(const Config& config, const TrainOptions& options) {
  auto run = std::make_unique<TrainingRun>(config, options);
  join_processes(*run);
  open_run_directory(*run);
  build_model(*run);
  check_checkpoint_room(*run);
  start_metrics(*run);
  choose_start(*run);
  set_up_loss_scaling(*run);
  set_up_step(*run);
  return run;
}

}  // namespace trainer
