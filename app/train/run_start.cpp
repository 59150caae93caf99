#include "app/train/run_start.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "app/common/format.h"
#include "app/run/checkpoint.h"
#include "app/run/device_setup.h"
#include "dist/consistency.h"
#include "dist/error.h"
#include "dist/zero_optimizer.h"
#include "metrics/run_csv.h"

namespace trainer {
namespace {

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

// The resume point of a run that starts from scratch (compared between ranks).
constexpr const char* kFreshStart = "a fresh start";

// Resolves --resume to a checkpoint directory on this rank's view of ckpt_dir, or nothing for a fresh start.
// With "auto", broken checkpoints are skipped loudly; when every checkpoint is broken the run stops:
// starting from scratch would train over them, and an exit status 0 would hide the loss.
std::optional<std::string> resolve_resume(const std::string& resume, const std::string& ckpt_dir, Log& log,
                                          const ResumeLimits* limits, const std::string& rescue_dir) {
  if (resume.empty()) return std::nullopt;
  if (resume != "auto") return resume;
  std::vector<std::string> skipped;
  auto found = find_latest_checkpoint(ckpt_dir, &skipped, limits);
  for (const std::string& why : skipped) log.error("warning: skipping broken checkpoint: " + why);
  // A final checkpoint that checkpoint.dir could not take went to the run directory: the newer wins.
  std::vector<std::string> rescue_skipped;
  const auto rescued =
      rescue_dir.empty() ? std::nullopt : find_latest_checkpoint(rescue_dir, &rescue_skipped, limits);
  if (rescued && (!found || rescued->state.step > found->state.step)) {
    log.line("resume auto: " + rescued->path + " (rescued when " + ckpt_dir +
             " could not take it) is the newest checkpoint");
    return rescued->path;
  }
  if (!found && !skipped.empty())
    throw CheckpointError(
        fmt("--resume auto: every checkpoint in %s is broken (%zu, listed above); refusing "
            "to start from scratch over them. HINT: to start afresh, move or remove %s, or "
            "run without --resume; to resume one of them anyway, repair it and pass "
            "--resume PATH",
            ckpt_dir.c_str(), skipped.size(), ckpt_dir.c_str()));
  if (!found) {
    log.line("resume auto: no checkpoint in " + ckpt_dir + ", starting from scratch");
    return std::nullopt;
  }
  if (!skipped.empty())
    log.error(fmt("warning: --resume auto: %zu newer checkpoint(s) broken; falling back to %s",
                  skipped.size(), found->path.c_str()));
  return found->path;
}

}  // namespace

std::string agreed_resume(const std::string& resume, const std::string& ckpt_dir, int rank, Store* store,
                          std::chrono::milliseconds timeout, Log& log, const ResumeLimits* limits,
                          const std::string& rescue_dir) {
  if (resume != "auto" || !store)
    return resolve_resume(resume, ckpt_dir, log, limits, rescue_dir).value_or("");
  // "=" + the choice ("" is a fresh start), or "!" + why rank 0 could not choose: the others must not
  // wait out the timeout for a rank 0 that has failed (a stale NFS handle throws here).
  const std::string key = "trainer/resume_auto";
  if (rank == 0) {
    try {
      const std::string chosen = resolve_resume(resume, ckpt_dir, log, limits, rescue_dir).value_or("");
      store->set(key, "=" + chosen);
      return chosen;
    } catch (const std::exception& e) {
      store->set(key, std::string("!") + e.what());
      throw;
    }
  }
  const std::string value = store->get(key, timeout);
  if (value.empty() || value[0] != '=')
    throw std::runtime_error("--resume auto: rank 0 could not choose a checkpoint in " + ckpt_dir + ": " +
                             value.substr(value.empty() ? 0 : 1));
  const std::string chosen = value.substr(1);
  log.line("resume auto: rank 0 chose " + (chosen.empty() ? std::string(kFreshStart) : chosen));
  return chosen;
}

// The per-step CSV of a resumed run keeps the lines up to the checkpoint's step: the steps a crashed
// run logged after its last checkpoint are done again, and must appear once. Rows are the lines that
// start with a step number, so a lost header comes back and a line cut by a kill is dropped.
void truncate_step_csv(const std::string& path, int64_t last_step, const std::string& header,
                       const FullDiskHook& full_disk) {
  std::ifstream in(path);
  std::string line, kept = header + "\n";
  while (std::getline(in, line))
    if (!line.empty() && std::isdigit(static_cast<unsigned char>(line[0])) &&
        std::count(line.begin(), line.end(), ',') == std::count(header.begin(), header.end(), ',') &&
        std::atoll(line.c_str()) <= last_step)
      kept += line + "\n";
  in.close();
  write_whole_file(path, kept, full_disk);
}

std::string loader_workers_warning(int workers, int local_world_size, unsigned cores) {
  const int64_t total = static_cast<int64_t>(workers) * std::max(1, local_world_size);
  if (workers < 0 || total <= static_cast<int64_t>(cores)) return "";
  return fmt(
      "warning: data.workers = %d on each of this node's %d ranks starts %lld loader threads for %u "
      "cores. HINT: set data.workers = -1 (each rank gets its share of the cores) or fewer workers",
      workers, std::max(1, local_world_size), static_cast<long long>(total), cores);
}

void export_nccl_settings(const Config& config) {
  if (!config.dist.nccl_debug.empty()) ::setenv("NCCL_DEBUG", config.dist.nccl_debug.c_str(), 1);
  if (!config.dist.socket_ifname.empty())
    ::setenv("NCCL_SOCKET_IFNAME", config.dist.socket_ifname.c_str(), 1);
}

std::string lr_scaling_note(const Config& config, int world_size) {
  const int64_t global = global_batch(config, world_size);
  if (config.optim.lr_scaling != LrScaling::none || global == config.data.batch_size) return "";
  return fmt(
      "note: optim.lr = %g is used as given for a global batch of %lld (%d rank(s) x batch %lld x %d "
      "accumulated). HINT: to scale it with the global batch (lr x global batch / base batch, the "
      "linear rule), set optim.lr_scaling = \"linear\" and optim.base_batch_size to the batch the "
      "lr was tuned for",
      config.optim.lr, static_cast<long long>(global), world_size,
      static_cast<long long>(config.data.batch_size), config.train.grad_accum_steps);
}

// ---- setup: processes, run directory, log, experiment, the ranks' agreement

DistOptions dist_options(const Config& config, const Device& device, const TrainerBuild& build) {
  DistOptions dopt;
  dopt.device = device;
  dopt.backend = setting_name(config.dist.backend);  // the config reads "gloo" as "tcp"
  dopt.timeout = std::chrono::seconds(config.dist.timeout_seconds);
  dopt.connect_timeout = dopt.timeout;  // a rank that never starts is reported after dist.timeout_seconds
  dopt.build = build.str();
  // NCCL only: it cannot run two ranks on one GPU anyway (its own error is terse), while ranks that
  // share a GPU on purpose (MPS, time-slicing) still can with dist.backend = "tcp".
  if (resolve_comm_backend(dopt) == "nccl") dopt.gpu_id = gpu_id(device);
  return dopt;
}

// With --resume auto and no explicit run_dir, the run continues in the newest run directory of this
// config (where its checkpoints are); otherwise a fresh run gets a new timestamped directory.
ProposedRunDir propose_run_dir(const Config& config, const TrainOptions& options) {
  ProposedRunDir proposed{config.train.run_dir, false};
  if (proposed.path.empty() && options.resume == "auto") proposed.path = latest_run_dir(config);
  if (proposed.path.empty()) proposed = {default_run_dir(config, std::time(nullptr)), true};
  return proposed;
}

// Rank 0 logs to train.log (and the terminal), the others to train.rank<N>.log; the run starts with the
// resolved configuration, which rank 0 also writes to config.toml.
void open_run_log(Log& log, const Config& config, const ProcessEnv& env, const std::string& run_dir,
                  const std::string& config_toml, int rank, const FullDiskHook& full_disk) {
  const bool writer = rank == 0;
  log.set_print_lines(writer);
  log.open_file(run_dir + (writer ? "/train.log" : "/train.rank" + std::to_string(rank) + ".log"), full_disk);
  if (writer) write_whole_file(run_dir + "/config.toml", config_toml, full_disk);
  log.line("trainer: resolved configuration (" + config.source_path + ")");
  log.line(config_table(config));
  log.line("processes: " + env.describe());
  for (const std::string& note : env.notes) log.line("note: " + note);
}

// Stops the run, naming what differs, unless every rank has the same build, config, data, steps per
// epoch, kind of device and processes per node (world size > 1 only).
void check_ranks_agree(ProcessGroup& pg, const TrainerBuild& build, const std::string& config_toml,
                       const Experiment& e, const Device& device, const ProcessEnv& env,
                       const DistOptions& dopt) {
  std::vector<ConsistencyItem> items = run_identity_items(
      {build.str(), content_hash(config_toml), e.data.train->fingerprint(), e.steps_per_epoch});
  const std::vector<ConsistencyItem> keys = config_key_items(config_toml);
  items.insert(items.begin(), keys.begin(), keys.end());  // a differing key is named, not just a hash
  items.push_back(
      {"device", device.is_cuda() ? "cuda" : "cpu",
       "every rank must train on the same kind of device: check train.device and each node's GPUs"});
  items.push_back({"local world size", std::to_string(env.local_world_size),
                   "launch the same number of processes on every node"});
  check_consistency_connected(pg.comm(), *pg.store(), pg.rank(), pg.world_size(), items, dopt.timeout,
                              "startup");
}

// dist.zero_stage 1|2: the optimizer keeps the state of this rank's shard only and reduces the
// gradients itself (reduce-scatter, clipping over the shards, all-gather), so the DDP reducer stays idle.
// Stage 2 brings its own reducer, whose hooks reduce-scatter each bucket during backward.
// Wraps e.optimizer and returns the wrapper, or null with dist.zero_stage = 0.
ZeroOptimizer* wrap_in_zero_optimizer(const Config& config, Experiment& e, ProcessGroup& pg, Log& log) {
  if (config.dist.zero_stage <= 0) return nullptr;
  ZeroOptions zo;
  zo.stage = config.dist.zero_stage;
  zo.max_grad_norm = config.optim.clip_grad_norm;
  for (const NamedParameter& p : e.model->named_parameters()) zo.registration_order.push_back(p.name);
  auto z = std::make_unique<ZeroOptimizer>(pg.comm_ptr(), std::move(e.optimizer), zo);
  ZeroOptimizer* zero = z.get();
  e.optimizer = std::move(z);
  log.line(zero->describe());
  return zero;
}

void log_run_description(Log& log, const Config& config, const Experiment& e, const Device& device,
                         const std::string& run_dir, const TrainerBuild& build) {
  log.line("data:  " + e.data.train->fingerprint());
  log.line("test:  " + e.data.test->fingerprint());
  log.line(fmt("model: %s, %lld parameters; %lld steps/epoch, %lld steps, lr %.4g", config.model.name.c_str(),
               static_cast<long long>(e.model->parameter_count()), static_cast<long long>(e.steps_per_epoch),
               static_cast<long long>(e.total_steps), e.base_lr));
  if (!e.pretrained_note.empty()) log.line(e.pretrained_note);
  for (const std::string& note : e.schedule_notes) log.line("warning: " + note);
  log.line("device: " + device.str() + ", run directory: " + run_dir);
  log.line("build: " + build.str());
}

ExporterOptions exporter_options(const Config& config, const ProcessEnv& env, int rank,
                                 const TrainerBuild& build, const std::string& run_dir) {
  ExporterOptions xo;
  xo.port = config.metrics.port;
  xo.local_rank = env.local_rank;
  xo.rank = rank;
  xo.world_size = env.world_size;
  xo.host = config.metrics.host_label;
  xo.bind_address = config.metrics.bind;
  std::filesystem::path dir = std::filesystem::path(run_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "runs/a/"
  xo.run = config.metrics.run.empty() ? dir.filename().string() : config.metrics.run;
  xo.build = {build.version, build.revision, build.cuda_version, build.cudnn_version, build.nccl_version};
  return xo;
}

// ---- where to start: a fresh run, or exactly where a checkpoint left off

namespace {

// Loads the checkpoint at resume_path (agreed_resume; "" is a fresh start). `start` is set to where this rank
// starts, for the ranks to compare (check_ranks_start_alike) before anything is written.
TrainingState start_or_resume(const Config& config, const std::string& resume_path, Experiment& e,
                              const std::string& run_dir, Log& log, std::string& start,
                              const ResumeLimits& limits) {
  TrainingState st;
  start = kFreshStart;
  st.world_size = e.world_size;
  st.batch_size = config.data.batch_size;
  st.run_dir = run_dir;
  if (!resume_path.empty()) {
    st = load_checkpoint(resume_path, *e.model, *e.optimizer, e.ema.get());
    check_position_fits(st, resume_path, limits);
    start = fmt("step %lld of checkpoint %s", static_cast<long long>(st.step),
                checkpoint_identity(resume_path).c_str());
    if (st.world_size != e.world_size) {
      if (!config.checkpoint.allow_world_size_change)
        throw config_error_at(
            config, "checkpoint.allow_world_size_change",
            fmt("the checkpoint was written by %d ranks, this run has %d. HINT: resume with "
                "the same number of processes, or set checkpoint.allow_world_size_change = "
                "true (the rest of the epoch is then re-sharded: each sample still seen once)",
                st.world_size, e.world_size));
      log.line(remap_world_size(st, e.data.train->size(), config.data.drop_last, e.world_size,
                                config.data.batch_size, config.train.grad_accum_steps));
    }
    if (!st.rng_states.empty()) e.dropout_generator->set_state(st.rng_states[0]);
    log.line(fmt("resumed from %s: step %lld, epoch %lld, batch %lld of the epoch", resume_path.c_str(),
                 static_cast<long long>(st.step), static_cast<long long>(st.epoch + 1),
                 static_cast<long long>(st.batch_in_epoch)));
  }
  return st;
}

}  // namespace

// Rank 0's train_steps.csv from where the run starts: cut back to the checkpoint's step on a resume
// (the steps a crashed run logged after it are run again), a header alone on a fresh start. Only once
// the ranks agree on the start, so a rank that is the odd one out destroys no history.
void begin_step_csv(const std::string& csv_path, const std::string& start, const TrainingState& st,
                    const FullDiskHook& full_disk) {
  const std::string header = train_steps_header();
  if (start != kFreshStart)
    truncate_step_csv(csv_path, st.step, header, full_disk);
  else
    write_whole_file(csv_path, header + "\n", full_disk);
}

namespace {

// Stops every rank unless all start from the same point (world size > 1 only). Rank 0's weights were
// broadcast before the resume, so a rank that cannot see the checkpoint directory (no shared file
// system), was started without --resume, or was given another checkpoint would otherwise train from
// other weights, optimizer state and step, and the ranks would part silently or hang at the end.
void check_ranks_start_alike(ProcessGroup& pg, const std::string& start, const DistOptions& dopt) {
  check_consistency_connected(
      pg.comm(), *pg.store(), pg.rank(), pg.world_size(),
      {{"resume point", start,
        "every rank must resume from the same checkpoint: give every node the same --resume "
        "and put train.run_dir (its checkpoints/) on a file system every node sees, or copy "
        "the checkpoint to the same path on each node"}},
      dopt.timeout, "resume");
}

}  // namespace

// start_or_resume on every rank, then the ranks' agreement on the start (world size > 1). A rank that
// cannot load its checkpoint says why in the agreement, so every rank stops at once naming it, instead
// of the others waiting out dist.timeout_seconds for a rank that has gone.
TrainingState agreed_start(const Config& config, const TrainOptions& options, Experiment& e,
                           const std::string& run_dir, const std::string& ckpt_dir, Log& log,
                           ProcessGroup& pg, const DistOptions& dopt, std::string& start) {
  const ResumeLimits limits{e.data.train->size(), config.data.drop_last, config.train.epochs};
  const auto start_here = [&] {
    Store* store = pg.world_size() > 1 ? pg.store() : nullptr;
    const std::string resume = agreed_resume(options.resume, ckpt_dir, pg.rank(), store, dopt.connect_timeout,
                                             log, &limits, run_dir + "/" + kRescuedCheckpointsDir);
    return start_or_resume(config, resume, e, run_dir, log, start, limits);
  };
  if (pg.world_size() <= 1) return start_here();
  TrainingState st;
  std::exception_ptr failure;
  try {
    st = start_here();
  } catch (const WaitInterrupted&) {
    throw;  // a stop signal: this rank leaves, and the others' agreement notices it at once
  } catch (const std::exception& error) {
    failure = std::current_exception();
    start = std::string("none, it stopped: ") + error.what();
  }
  check_ranks_start_alike(pg, start, dopt);
  if (failure) std::rethrow_exception(failure);
  return st;
}

}  // namespace trainer
