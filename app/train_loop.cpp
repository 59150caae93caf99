#include "app/train_loop.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "app/build_info.h"
#include "app/checkpoint.h"
#include "app/device_setup.h"
#include "app/evaluate.h"
#include "app/experiment.h"
#include "app/phase_clock.h"
#include "app/summary.h"
#include "app/train_signals.h"
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
#include "metrics/log.h"
#include "metrics/step_timer.h"
#include "nn/amp/autocast.h"
#include "nn/amp/loss_scaler.h"
#include "nn/functional.h"
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

std::string fmt(const char* format, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

}  // namespace

int default_loader_workers() {
  // Cores are shared by the ranks of this node; each rank's loader gets its share, at least one.
  const char* local_world = std::getenv("LOCAL_WORLD_SIZE");
  const unsigned ranks = std::max(1, local_world ? std::atoi(local_world) : 1);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::max(1u, cores / ranks / 2));  // the other half is the math library's
}

namespace {

// Train-step bookkeeping for the progress display and the per-step CSV.
struct StepLog {
  std::ofstream csv;
  double window_loss = 0.0;
  int window_steps = 0;
};

// The per-step CSV of a resumed run keeps the lines up to the checkpoint's step: the steps a crashed
// run logged after its last checkpoint are done again, and must appear once.
void truncate_step_csv(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  std::string line, kept;
  if (std::getline(in, line)) kept = line + "\n";
  while (std::getline(in, line))
    if (std::atoll(line.c_str()) <= last_step) kept += line + "\n";
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
}

// The newest existing run directory of this config (runs/<config stem>-<time>), or "" when none.
std::string latest_run_dir(const Config& config) {
  const std::filesystem::path pattern = default_run_dir(config, 0);
  const std::filesystem::path parent = pattern.parent_path().empty() ? "." : pattern.parent_path();
  const std::string stem = pattern.filename().string();
  const std::string prefix = stem.substr(0, stem.rfind('-', stem.rfind('-') - 1) + 1);  // "<stem>-"
  std::string best;
  if (!std::filesystem::is_directory(parent)) return best;
  for (const auto& d : std::filesystem::directory_iterator(parent)) {
    const std::string name = d.path().filename().string();
    if (d.is_directory() && name.rfind(prefix, 0) == 0 && (best.empty() || d.path().string() > best))
      best = d.path().string();
  }
  return best;
}

// One consistency item per config key ("config key optim.lr" = "0.1"), from the resolved TOML.
std::vector<ConsistencyItem> config_key_items(const std::string& config_toml) {
  std::vector<ConsistencyItem> items;
  std::istringstream in(config_toml);
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    items.push_back({"config key " + section + "." + line.substr(0, eq), line.substr(eq + 3),
                     "start every rank with the same config file and the same --set overrides"});
  }
  return items;
}

// Resolves --resume to a checkpoint directory, or nothing for a fresh start.
std::optional<std::string> resolve_resume(const std::string& resume, const std::string& ckpt_dir, Log& log) {
  if (resume.empty()) return std::nullopt;
  if (resume != "auto") return resume;
  std::vector<std::string> skipped;
  auto found = find_latest_checkpoint(ckpt_dir, &skipped);
  for (const std::string& why : skipped) log.error("warning: skipping broken checkpoint: " + why);
  if (!found) {
    log.line("resume auto: no checkpoint in " + ckpt_dir + ", starting from scratch");
    return std::nullopt;
  }
  return found->path;
}

}  // namespace

int run_training(const Config& config, const TrainOptions& options) {
  install_stop_handlers();
  const TrainerBuild build = trainer_build();
  // ---- processes: who we are (torchrun / SLURM / OpenMPI variables) and the others
  const ProcessEnv env = process_env();
  // NCCL reads its settings from the environment when the communicator is created: set them from the
  // config so users need not export them on every node by hand.
  if (!config.dist.nccl_debug.empty()) ::setenv("NCCL_DEBUG", config.dist.nccl_debug.c_str(), 1);
  if (!config.dist.socket_ifname.empty())
    ::setenv("NCCL_SOCKET_IFNAME", config.dist.socket_ifname.c_str(), 1);
  // The device first: NCCL needs it, and LOCAL_RANK picks it (never a silent fallback to GPU 0).
  const Device device = setup_device(config, env.local_rank);
  check_precision(config, device);
  DistOptions dopt;
  dopt.device = device;
  dopt.backend = config.dist.backend == "gloo" ? "cpu" : config.dist.backend;  // "gloo" names the CPU path
  dopt.timeout = std::chrono::seconds(config.dist.timeout_seconds);
  dopt.connect_timeout = dopt.timeout;  // a rank that never starts is reported after dist.timeout_seconds
  dopt.build = build.str();
  std::unique_ptr<ProcessGroup> pg = ProcessGroup::init(env, dopt);
  // A failed collective's message says where every rank was (dist/heartbeat.h).
  const DescribeRanksOnFailure describe_ranks_on_failure(pg->heartbeat());
  const int rank = pg->rank(), world = pg->world_size();
  const bool writer = rank == 0;  // only rank 0 writes checkpoints, the summary and the shared files

  // With --resume auto and no explicit run_dir, the run continues in the newest run directory of this
  // config (where its checkpoints are); otherwise a fresh run gets a new timestamped directory. Rank 0
  // decides and the others take its choice: ranks start at different seconds.
  std::string run_dir = config.train.run_dir;
  if (writer) {
    if (run_dir.empty() && options.resume == "auto") run_dir = latest_run_dir(config);
    if (run_dir.empty()) run_dir = default_run_dir(config, std::time(nullptr));
    if (pg->store()) pg->store()->set("trainer/run_dir", run_dir);
  } else {
    run_dir = pg->store()->get("trainer/run_dir", dopt.connect_timeout);
  }
  const std::string ckpt_dir =
      config.checkpoint.dir.empty() ? run_dir + "/checkpoints" : config.checkpoint.dir;
  if (writer) std::filesystem::create_directories(ckpt_dir);
  if (pg->store()) pg->store()->barrier("trainer/run_dir_created", rank, world, dopt.connect_timeout);
  Log& log = Log::instance();
  log.set_print_lines(writer);
  log.open_file(run_dir + (writer ? "/train.log" : "/train.rank" + std::to_string(rank) + ".log"));
  const std::string config_toml = config_to_toml(config);
  if (writer) std::ofstream(run_dir + "/config.toml") << config_toml;
  log.line("trainer: resolved configuration (" + config.source_path + ")");
  log.line(config_table(config));
  log.line("processes: " + env.describe());
  for (const std::string& note : env.notes) log.line("note: " + note);

  Experiment e = build_experiment(config, device, true, world, rank);
  // SyncBN: batch statistics over all ranks (in place: the optimizer's parameters stay the same).
  if (config.model.sync_bn) convert_sync_batchnorm(*e.model, pg->comm_ptr());
  // Without SyncBN, ranks' running statistics drift apart: average them before eval and checkpoints.
  const bool average_bn_stats = !config.model.sync_bn && config.model.bn_stats_sync == "average";
  if (world > 1) {
    std::vector<ConsistencyItem> items = run_identity_items(
        {build.str(), content_hash(config_toml), e.data.train->fingerprint(), e.steps_per_epoch});
    const std::vector<ConsistencyItem> keys = config_key_items(config_toml);
    items.insert(items.begin(), keys.begin(), keys.end());  // a differing key is named, not just a hash
    items.push_back(
        {"device", device.is_cuda() ? "cuda" : "cpu",
         "every rank must train on the same kind of device: check train.device and each node's GPUs"});
    items.push_back({"local world size", std::to_string(env.local_world_size),
                     "launch the same number of processes on every node"});
    check_consistency(*pg->store(), rank, world, items, dopt.timeout);
  }
  // Every rank starts from rank 0's weights and buffers; gradients are averaged in buckets while
  // backward runs (nothing happens at world size 1).
  broadcast_state(pg->comm(), e.model->state_dict());
  // dist.zero_stage 1|2: the optimizer keeps the state of this rank's shard only and reduces the
  // gradients itself (reduce-scatter, clipping over the shards, all-gather), so the DDP reducer stays idle.
  // Stage 2 brings its own reducer, whose hooks reduce-scatter each bucket during backward.
  ZeroOptimizer* zero = nullptr;
  if (config.dist.zero_stage > 0) {
    ZeroOptions zo{config.dist.zero_stage, config.optim.clip_grad_norm};
    for (const NamedParameter& p : e.model->named_parameters()) zo.registration_order.push_back(p.name);
    auto z = std::make_unique<ZeroOptimizer>(pg->comm_ptr(), std::move(e.optimizer), zo);
    zero = z.get();
    e.optimizer = std::move(z);
    log.line(zero->describe());
  }
  GradientReducer ddp_reducer(zero ? std::make_shared<SingleProcessComm>() : pg->comm_ptr(),
                              e.model->named_parameters());
  GradientReducer& reducer = zero && zero->gradient_reducer() ? *zero->gradient_reducer() : ddp_reducer;
  const Dataset& train = *e.data.train;
  log.line("data:  " + train.fingerprint());
  log.line("test:  " + e.data.test->fingerprint());
  log.line(fmt("model: %s, %lld parameters; %lld steps/epoch, %lld steps, lr %.4g", config.model.name.c_str(),
               static_cast<long long>(e.model->parameter_count()), static_cast<long long>(e.steps_per_epoch),
               static_cast<long long>(e.total_steps), e.base_lr));
  log.line("device: " + device.str() + ", run directory: " + run_dir);
  log.line("build: " + build.str());

  // ---- observability: per-phase step times, exported per rank for Prometheus
  ExporterOptions xo;
  xo.port = config.metrics.port;
  xo.local_rank = env.local_rank;
  xo.rank = rank;
  xo.host = config.metrics.host_label;
  xo.build = {build.version, build.cuda_version, build.cudnn_version, build.nccl_version};
  Exporter exporter(xo);
  if (exporter.enabled()) log.line("metrics: " + exporter.url());
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
  TrainingState st;
  st.world_size = e.world_size;
  st.batch_size = config.data.batch_size;
  st.run_dir = run_dir;
  const std::string csv_path = run_dir + "/train_steps.csv";
  if (auto path = resolve_resume(options.resume, ckpt_dir, log)) {
    st = load_checkpoint(*path, *e.model, *e.optimizer);
    if (st.world_size != e.world_size) {
      if (!config.checkpoint.allow_world_size_change)
        throw config_error_at(
            config, "checkpoint.allow_world_size_change",
            fmt("the checkpoint was written by %d ranks, this run has %d. HINT: resume with "
                "the same number of processes, or set checkpoint.allow_world_size_change = "
                "true (the rest of the epoch is then re-sharded: each sample still seen once)",
                st.world_size, e.world_size));
      log.line(remap_world_size(st, train.size(), config.data.drop_last, e.world_size, config.data.batch_size,
                                config.train.grad_accum_steps));
    }
    if (!st.rng_states.empty()) e.dropout_generator->set_state(st.rng_states[0]);
    if (writer) truncate_step_csv(csv_path, st.step);
    log.line(fmt("resumed from %s: step %lld, epoch %lld, batch %lld of the epoch", path->c_str(),
                 static_cast<long long>(st.step), static_cast<long long>(st.epoch + 1),
                 static_cast<long long>(st.batch_in_epoch)));
  } else if (writer) {
    std::ofstream(csv_path, std::ios::trunc) << "step,epoch,loss,lr\n";
  }
  // Rank 0's losses only (each rank's loss is of its own shard; the weights are the same everywhere).
  StepLog steps;
  if (writer) steps.csv.open(csv_path, std::ios::app);
  // Rank 0's phase seconds per optimizer step, for `trainer bench`. StepTimes count this process's
  // steps from 1, so a resumed run numbers them after the checkpoint's step.
  std::ofstream step_times_csv;
  const int64_t first_step = st.step;
  if (writer) {
    const std::string path = run_dir + "/step_times.csv";
    const bool fresh = st.step == 0 || !std::filesystem::exists(path);
    if (!fresh) truncate_step_csv(path, st.step);
    step_times_csv.open(path, fresh ? std::ios::trunc : std::ios::app);
    if (fresh) {
      step_times_csv << "step,step_seconds";
      for (Phase p : kAllPhases)
        if (p != Phase::step) step_times_csv << ',' << phase_name(p) << "_seconds";
      step_times_csv << '\n';
    }
  }
  auto observe_step = [&](const StepTimes& t) {
    exporter.observe_step(t);
    if (!step_times_csv.is_open()) return;
    step_times_csv << first_step + t.step << ',' << fmt("%.9g", t[Phase::step]);
    for (Phase p : kAllPhases)
      if (p != Phase::step) step_times_csv << ',' << fmt("%.9g", t[p]);
    step_times_csv << '\n';
  };

  // fp16 needs dynamic loss scaling; every other precision runs with the scaler disabled (scale 1).
  LossScalerOptions so;
  so.enabled = config.train.precision == "fp16";
  LossScaler scaler(so);
  const std::optional<DType> half_dtype = autocast_dtype_for(config);
  const MemoryFormat input_format = input_memory_format(config);
  if (st.loss_scale > 0) scaler.load_state(st.loss_scale, st.loss_scale_growth_tracker);
  // The largest of one integer over all ranks (no communication at world size 1).
  auto max_over_ranks = [&](int64_t local) -> int64_t {
    if (world == 1) return local;
    Tensor value = Tensor::from_vector<int64_t>({local}, {1});
    pg->comm().all_reduce(value, ReduceOp::max);
    return static_cast<int64_t>(value.item());
  };
  auto all_ranks_finite = [&](bool local) { return max_over_ranks(local ? 0 : 1) == 0; };
  // Only rank 0 writes; the others wait for it, so no rank runs ahead of a checkpoint in progress.
  auto save_checkpoint = [&](bool final) {
    if (average_bn_stats) average_bn_running_stats(*e.model, pg->comm());
    if (zero) zero->gather_state();  // the full optimizer state, for rank 0 to write
    st.loss_scale = scaler.scale();
    st.loss_scale_growth_tracker = scaler.growth_tracker();
    if (writer) {
      const std::string dropout_state = e.dropout_generator->state();
      st.rng_states.assign(world, dropout_state);
      try {
        if (Heartbeat* h = pg->heartbeat()) h->set_phase("checkpoint");
        const std::string path = checkpoints.save(*e.model, *e.optimizer, st, config_toml);
        log.line("checkpoint: " + path);
      } catch (const CheckpointError& err) {
        // The previous checkpoints are intact; by default a periodic failure (full disk, say) must not
        // kill hours of training (checkpoint.on_error), but the final one must not fail silently.
        if (final || config.checkpoint.on_error == "stop") throw;
        log.error(std::string("warning: ") + err.what() +
                  "; earlier checkpoints are intact, training continues");
      }
    }
    if (Heartbeat* h = pg->heartbeat()) h->set_phase("barrier after the checkpoint");
    pg->comm().barrier();
  };
  // Every rank must stop at the same step, or the ones still training wait forever: a stop signal
  // seen by any rank is agreed on with one tiny all-reduce per step.
  auto agreed_stop_signal = [&]() { return static_cast<int>(max_over_ranks(stop_requested())); };

  const int accum = config.train.grad_accum_steps;
  const std::vector<Variable> params = e.model->parameters();
  DistributedSampler sampler(train.size(), e.world_size, rank, config.data.shuffle,
                             static_cast<uint64_t>(config.train.seed), config.data.drop_last);
  RunSummary summary;
  summary.world_size = e.world_size;
  summary.run_dir = run_dir;
  summary.best_test_accuracy = st.best_accuracy;
  int stop_signal = 0;
  bool done = st.step >= e.total_steps;
  // Test hook: deliver SIGTERM to ourselves after this step, to exercise the signal path exactly.
  const char* signal_at = std::getenv("TRAINER_TEST_SIGTERM_AT_STEP");
  const int64_t sigterm_at_step = signal_at ? std::atoll(signal_at) : -1;
  // Test hook: TRAINER_TEST_STALL="RANK:STEP:SECONDS" makes that rank wait in data_wait before that
  // step (a stuck data loader), so the others' collective times out.
  int stall_rank = -1;
  long long stall_step = -1;
  double stall_seconds = 0;
  if (const char* stall = std::getenv("TRAINER_TEST_STALL"))
    std::sscanf(stall, "%d:%lld:%lf", &stall_rank, &stall_step, &stall_seconds);
  Heartbeat* heartbeat = pg->heartbeat();  // tells the other ranks where this one is, for their errors
  if (heartbeat) timer.set_phase_observer([heartbeat](Phase p) { heartbeat->set_phase(phase_name(p)); });

  for (; st.epoch < config.train.epochs && !done; ++st.epoch) {
    const int epoch = static_cast<int>(st.epoch);
    sampler.set_epoch(epoch);
    LoaderOptions lo;
    lo.batch_size = config.data.batch_size;
    lo.drop_last = config.data.drop_last;
    lo.transforms.crop_padding = config.data.random_crop_padding;
    lo.transforms.horizontal_flip = config.data.hflip;
    lo.seed = static_cast<uint64_t>(config.train.seed);
    lo.epoch = epoch;
    lo.num_workers = config.data.workers < 0 ? default_loader_workers() : config.data.workers;
    lo.queue_depth = config.data.prefetch_batches;
    lo.first_batch = st.batch_in_epoch;
    // data.gpu_input_pipeline: pinned batches; batch k+1 uploads on a copy stream during step k and is
    // normalised on the device. Otherwise the host normalises and the copy below is synchronous.
    const Device input_device = device.is_cuda() && config.data.gpu_input_pipeline ? device : Device::cpu();
    lo.allocate_batch = batch_allocator_for(input_device);
    DataLoader loader(e.data.train, sampler.indices_from(st.epoch_sample_offset), lo);
    DevicePrefetcher input(loader, input_device, {e.normalization.mean, e.normalization.std, input_format});
    // Ranks that would run different numbers of steps hang in an all-reduce at the epoch's end: stop
    // here instead, naming them.
    if (heartbeat) heartbeat->set_phase("epoch start (step-count check)");
    check_epoch_steps(pg->comm(), epoch, loader.num_batches() - lo.first_batch);

    e.model->train();
    e.optimizer->zero_grad();  // micro-batches left over by the previous epoch must not leak into this one
    const auto epoch_start = Clock::now();
    const double seconds_before_epoch = st.train_seconds;
    const int64_t samples_before_epoch = st.samples_seen;
    exporter.set_epoch(epoch + 1);
    int micro = 0;
    double accum_loss = 0.0;
    int64_t step_samples = 0;
    while (!done) {
      if (!timer.in_step()) timer.begin_step();
      // ---- data
      timer.begin(Phase::data_wait);
      if (rank == stall_rank && st.step == stall_step)
        std::this_thread::sleep_for(std::chrono::duration<double>(stall_seconds));
      std::optional<Batch> batch = input.next();
      timer.end(Phase::data_wait);
      if (!batch) break;
      timer.begin(Phase::h2d);
      const DeviceBatch on_device = input.to_device(*batch);
      Tensor images = on_device.images.to(device).contiguous(input_format);  // no-ops on the GPU pipeline
      const Tensor labels = on_device.labels.to(device);
      timer.end(Phase::h2d);
      // ---- forward (autocast for bf16/fp16: convolutions and matmuls in half, loss in fp32)
      timer.begin(Phase::forward);
      Variable loss;
      {
        AutocastScope autocast(half_dtype);
        loss = F::cross_entropy((*e.model)(Variable(images)), labels, config.train.label_smoothing);
      }
      const double loss_value = loss.item();
      timer.end(Phase::forward);
      if (!std::isfinite(loss_value))
        throw std::runtime_error(
            fmt("loss is %s at step %lld (epoch %d): training diverged. HINT: lower optim.lr "
                "(now %.4g), add warmup (schedule.warmup_epochs) or clipping "
                "(optim.clip_grad_norm); --resume auto restarts from the last checkpoint",
                std::isnan(loss_value) ? "NaN" : "infinite", static_cast<long long>(st.step + 1), epoch + 1,
                e.optimizer->lr()));
      // ---- backward (the loss of each micro-batch counts 1/k, so k micro-batches equal one big one)
      timer.begin(Phase::backward);
      const bool last_micro = (micro + 1) % accum == 0;
      reducer.set_sync(last_micro);  // accumulation micro-batches communicate nothing
      scaler.scale_loss(accum > 1 ? F::mul(loss, 1.0 / accum) : loss).backward();
      timer.end(Phase::backward);
      accum_loss += loss_value / accum;
      st.samples_seen += batch->labels.numel() * e.world_size;
      step_samples += batch->labels.numel();
      ++st.batch_in_epoch;
      if (++micro % accum != 0) continue;
      // ---- all-reduce: wait for the buckets backward did not finish, average the gradients
      timer.begin(Phase::allreduce_exposed);
      reducer.finish();
      timer.end(Phase::allreduce_exposed);
      if (allreduce_open) timer.end(Phase::allreduce_total);
      allreduce_open = false;
      // ---- optimizer: unscale and check after the all-reduce (every rank skips the same steps), clip,
      // step
      timer.begin(Phase::optimizer);
      const bool finite = !scaler.enabled() ||
                          (zero ? scaler.unscale_and_check(zero->gradients_to_unscale(), all_ranks_finite)
                                : scaler.unscale_and_check(params, all_ranks_finite));
      const double lr = e.base_lr * e.schedule->factor(st.step);
      if (finite) {
        if (config.optim.clip_grad_norm > 0 && !zero) clip_grad_norm(params, config.optim.clip_grad_norm);
        e.optimizer->set_lr(lr);
        e.optimizer->step();
      } else {
        exporter.add_skipped_steps(1);
        log.line(fmt("step %lld: inf/NaN gradients at loss scale %g, step skipped",
                     static_cast<long long>(st.step + 1), scaler.scale()));
      }
      scaler.update(!finite);
      exporter.set_loss_scale(scaler.scale());
      e.optimizer->zero_grad();
      timer.end(Phase::optimizer);
      ++st.step;
      if (heartbeat) heartbeat->set_step(st.step);
      if (auto t = timer.end_step()) observe_step(*t);
      exporter.add_step(step_samples);
      step_samples = 0;
      exporter.set_loss(accum_loss);
      exporter.set_learning_rate(lr);
      exporter.set_bad_samples_total(train.skipped_samples());
#ifdef TRAINER_WITH_CUDA
      if (device.is_cuda()) {
        const CudaMemoryStats mem = cuda_memory_stats();
        exporter.set_device_memory({mem.allocated_bytes, mem.reserved_bytes, mem.peak_allocated_bytes});
      }
#endif
      // ---- bookkeeping
      steps.csv << st.step << ',' << epoch + 1 << ',' << fmt("%.9g", accum_loss) << ',' << fmt("%.9g", lr)
                << '\n';
      steps.window_loss += accum_loss;
      ++steps.window_steps;
      st.epoch_loss_sum += accum_loss;
      ++st.epoch_steps;
      accum_loss = 0.0;
      st.train_seconds = seconds_before_epoch + seconds_since(epoch_start);
      const double rate =
          (st.samples_seen - samples_before_epoch) / std::max(seconds_since(epoch_start), 1e-9);
      const double eta =
          (e.total_steps - st.step) *
          (e.steps_per_epoch ? seconds_since(epoch_start) / std::max<int64_t>(1, micro / accum) : 0.0);
      const std::string status =
          fmt("epoch %d/%d step %lld/%lld loss %.4f lr %.4g img/s %.0f eta %s", epoch + 1,
              config.train.epochs, static_cast<long long>(st.step), static_cast<long long>(e.total_steps),
              steps.window_loss / steps.window_steps, lr, rate, format_duration(eta).c_str());
      exporter.set_samples_per_second(rate / e.world_size);
      if (log.stdout_is_terminal()) log.transient(status);
      if (st.step % config.train.log_every_steps == 0) {
        if (!log.stdout_is_terminal()) log.line(status + " | " + timer.summary());
        steps.window_loss = 0.0;
        steps.window_steps = 0;
      }
      if (st.step >= e.total_steps) done = true;
      if (st.step == sigterm_at_step) std::raise(SIGTERM);
      if ((stop_signal = agreed_stop_signal()) != 0) break;
      if (!done && config.checkpoint.every_steps > 0 && st.step % config.checkpoint.every_steps == 0) {
        steps.csv.flush();
        st.accuracy = -1;
        save_checkpoint(false);
      }
    }
    st.train_seconds = seconds_before_epoch + seconds_since(epoch_start);
    if (heartbeat) heartbeat->set_phase("epoch end");  // its collectives follow (train loss, stop, eval)
    timer.discard_step();
    for (const auto& t : timer.flush()) observe_step(t);
    if (stop_signal) {
      steps.csv.flush();
      log.error(fmt("received signal %d at step %lld", stop_signal, static_cast<long long>(st.step)) +
                (config.checkpoint.on_signal ? ": writing a checkpoint before exiting" : ": exiting"));
      if (config.checkpoint.on_signal) save_checkpoint(true);
      pg->shutdown();
      return 128 + stop_signal;
    }
    const double epoch_seconds = seconds_since(epoch_start);
    // The epoch's train loss over every rank's batches, not rank 0's alone (one small all-reduce per
    // epoch; every rank gets here, the stop signal being agreed).
    Tensor loss_sums =
        Tensor::from_vector<double>({st.epoch_loss_sum, static_cast<double>(st.epoch_steps)}, {2});
    if (world > 1) pg->comm().all_reduce(loss_sums, ReduceOp::sum);
    const std::vector<double> sums = loss_sums.to_vector<double>();
    summary.final_train_loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    summary.epochs = epoch + 1;

    const bool last = done || epoch + 1 == config.train.epochs;
    const int every = config.train.eval_every_epochs;
    std::string eval_part;
    st.accuracy = -1;
    if (last || (every > 0 && (epoch + 1) % every == 0)) {
      const auto eval_start = Clock::now();
      if (average_bn_stats) average_bn_running_stats(*e.model, pg->comm());
      if (heartbeat) heartbeat->set_phase("evaluation");
      EvalMetrics m = evaluate(e, *e.data.test, &pg->comm());
      summary.final_test_accuracy = m.top1();
      summary.final_test_top5 = m.top5();
      summary.final_test_loss = m.mean_loss();
      st.accuracy = m.top1();
      st.best_accuracy = std::max(st.best_accuracy, m.top1());
      exporter.set_eval_accuracy(m.top1());
      summary.best_test_accuracy = st.best_accuracy;
      eval_part =
          fmt(" | test loss %.4f top1 %.2f%% top5 %.2f%%", m.mean_loss(), 100 * m.top1(), 100 * m.top5());
      if (!std::isnan(m.auc())) eval_part += fmt(" auc %.4f", m.auc());
      eval_part += fmt(" (%lld images, %.1fs)", static_cast<long long>(m.count()), seconds_since(eval_start));
      // Every rank holds the same merged metrics, so every rank stops after this epoch.
      const double target = config.train.target_accuracy;
      if (target > 0 && m.top1() >= target) {
        done = true;
        eval_part += fmt(" | target %.2f%% reached", 100 * target);
      }
    }
    log.line(fmt("epoch %d/%d: train loss %.4f, %.1fs, %.0f img/s", epoch + 1, config.train.epochs,
                 summary.final_train_loss, epoch_seconds,
                 (st.samples_seen - samples_before_epoch) / std::max(epoch_seconds, 1e-9)) +
             eval_part);
    // The next epoch starts at its first batch with fresh loss sums.
    const bool epoch_complete = !done || input.next() == std::nullopt;
    if (epoch_complete) {
      st.batch_in_epoch = 0;
      st.epoch_sample_offset = 0;
      st.epoch_loss_sum = 0.0;
      st.epoch_steps = 0;
    }
    const bool periodic =
        config.checkpoint.every_epochs > 0 && (epoch + 1) % config.checkpoint.every_epochs == 0;
    if (!done && periodic) {
      steps.csv.flush();
      ++st.epoch;  // the checkpoint resumes at the next epoch
      save_checkpoint(false);
      --st.epoch;
    }
    if (!epoch_complete) break;  // max_steps ended the run inside this epoch
  }

  steps.csv.flush();
  step_times_csv.flush();
  summary.steps = st.step;
  summary.train_seconds = st.train_seconds;
  summary.samples_per_second = st.samples_seen / std::max(st.train_seconds, 1e-9);
  if (config.checkpoint.save_final) {
    save_checkpoint(true);
    summary.weights = ckpt_dir + "/final.safetensors";
    if (writer) {
      save_module(summary.weights, *e.model);
      log.line("weights: " + summary.weights);
    }
  }
  if (writer) {
    write_summary(run_dir + "/summary.json", summary);
    if (!options.summary_path.empty()) write_summary(options.summary_path, summary);
  }
  pg->shutdown();
  log.line(fmt("done: %lld steps in %s (%.0f img/s), final test accuracy %.2f%%, best %.2f%%",
               static_cast<long long>(st.step), format_duration(st.train_seconds).c_str(),
               summary.samples_per_second, 100 * summary.final_test_accuracy,
               100 * summary.best_test_accuracy));
  log.close_file();
  return 0;
}

}  // namespace trainer
