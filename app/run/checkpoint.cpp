#include "app/run/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/common/crc32c.h"
#include "app/run/model_card_toml.h"
#include "data/distributed_sampler.h"
#include "nn/safetensors.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

// Format 2 adds the manifest's own CRC-32C; format 1 manifests (without it) are still read.
constexpr int kFormat = 2;
constexpr const char* kManifestCrcKey = "manifest_crc32c";
const char* kFiles[] = {"model.safetensors", "optimizer.safetensors", "config.toml"};
constexpr const char* kEmaFile = "ema.safetensors";  // only with ema.enabled

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw CheckpointError(path + ": cannot open to fsync");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw CheckpointError(path + ": fsync failed (disk full or I/O error?)");
}

// Test hook TRAINER_TEST_CRASH_BEFORE_RENAME=<step> (read at start-up, app/train/fault_injection.h): kills
// this process (SIGKILL, no unwinding, no cleanup) once the checkpoint of that step is complete in its
// temp directory but not yet renamed, the moment where a node failure would hurt most.
void crash_here_if_asked(int64_t crash_step, int64_t step) {
  if (crash_step >= 0 && crash_step == step) ::kill(::getpid(), SIGKILL);
}

uint32_t tensor_crc(const Tensor& t) {
  const Tensor host = t.to(Device::cpu()).contiguous();
  return crc32c(host.numel() ? host.raw_data() : nullptr, host.nbytes());
}

constexpr const char* kCrcKeyPrefix = "crc32c.";

// Tensors with their CRC-32C in the safetensors metadata ("crc32c.<name>"), and the model card when given.
void save_with_crcs(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                    const std::optional<ModelCard>& card = std::nullopt) {
  SafetensorsMetadata metadata = tensor_crc_metadata(tensors);
  if (card) metadata.merge(model_card_metadata(*card));
  save_safetensors(path, tensors, metadata);
}

// Every tensor of the file against its recorded CRC-32C; returns false when the file records none at
// all (a foreign file) and `foreign_ok`, else throws CheckpointError naming the file and tensor.
bool check_tensor_crcs(const SafetensorsFile& file, bool foreign_ok = false) {
  const std::string& path = file.path;
  const SafetensorsMetadata& meta = file.metadata;
  const bool records_crcs = std::any_of(
      meta.begin(), meta.end(), [](const auto& entry) { return entry.first.starts_with(kCrcKeyPrefix); });
  if (!records_crcs && foreign_ok) return false;
  for (const auto& [name, t] : file.tensors) {
    auto it = meta.find("crc32c." + name);
    if (it == meta.end()) throw CheckpointError(path + ": tensor '" + name + "' has no recorded CRC-32C");
    if (it->second != crc32c_hex(tensor_crc(t)))
      throw CheckpointError(path + ": tensor '" + name + "' is corrupt (CRC-32C mismatch)");
  }
  return true;
}

// The file read for the check: a file that cannot be read is a CheckpointError too.
SafetensorsFile read_for_crc_check(const std::string& path) {
  try {
    return read_safetensors(path);
  } catch (const std::exception& e) {
    throw CheckpointError(e.what());
  }
}

bool check_tensor_crcs(const std::string& path, bool foreign_ok = false) {
  return check_tensor_crcs(read_for_crc_check(path), foreign_ok);
}

toml::table state_to_toml(const TrainingState& s) {
  toml::array rngs;
  for (const auto& r : s.rng_states) rngs.push_back(r);
  return toml::table{{"step", s.step},
                     {"epoch", s.epoch},
                     {"batch_in_epoch", s.batch_in_epoch},
                     {"samples_seen", s.samples_seen},
                     {"world_size", s.world_size},
                     {"batch_size", s.batch_size},
                     {"train_seconds", s.train_seconds},
                     {"best_accuracy", s.best_accuracy},
                     {"accuracy", s.accuracy},
                     {"best_ema_accuracy", s.best_ema_accuracy},
                     {"ema_accuracy", s.ema_accuracy},
                     {"epoch_loss_sum", s.epoch_loss_sum},
                     {"epoch_steps", s.epoch_steps},
                     {"loss_scale", s.loss_scale},
                     {"loss_scale_growth_tracker", s.loss_scale_growth_tracker},
                     {"epoch_sample_offset", s.epoch_sample_offset},
                     {"rng_states", rngs},
                     {"run_dir", s.run_dir}};
}

TrainingState state_from_toml(const toml::table& t, const std::string& where) {
  auto need = [&](const char* key) -> const toml::node& {
    const toml::node* n = t.get(key);
    if (!n) throw CheckpointError(where + ": missing '" + key + "'");
    return *n;
  };
  auto int_of = [&](const char* key) {
    auto v = need(key).value<int64_t>();
    if (!v) throw CheckpointError(where + ": '" + std::string(key) + "' is not an integer");
    return *v;
  };
  auto float_of = [&](const char* key) {
    auto v = need(key).value<double>();
    if (!v) throw CheckpointError(where + ": '" + std::string(key) + "' is not a number");
    return *v;
  };
  TrainingState s;
  s.step = int_of("step");
  s.epoch = int_of("epoch");
  s.batch_in_epoch = int_of("batch_in_epoch");
  s.samples_seen = int_of("samples_seen");
  s.world_size = static_cast<int>(int_of("world_size"));
  s.batch_size = int_of("batch_size");
  s.train_seconds = float_of("train_seconds");
  s.best_accuracy = float_of("best_accuracy");
  s.accuracy = float_of("accuracy");
  s.best_ema_accuracy = t["best_ema_accuracy"].value_or(0.0);  // absent before the weight average
  s.ema_accuracy = t["ema_accuracy"].value_or(-1.0);
  s.epoch_loss_sum = float_of("epoch_loss_sum");
  s.epoch_steps = int_of("epoch_steps");
  s.loss_scale = float_of("loss_scale");
  s.loss_scale_growth_tracker = int_of("loss_scale_growth_tracker");
  s.epoch_sample_offset =
      t["epoch_sample_offset"].value_or(int64_t{0});  // absent before world-size remapping
  if (const toml::array* rngs = need("rng_states").as_array())
    for (const auto& r : *rngs) s.rng_states.push_back(r.value_or(std::string()));
  s.run_dir = need("run_dir").value_or(std::string());
  return s;
}

}  // namespace

CheckpointManager::CheckpointManager(std::string dir, const CheckpointConfig& config,
                                     int64_t crash_before_rename_step)
    : dir_(std::move(dir)), config_(config), crash_before_rename_step_(crash_before_rename_step) {}

std::string CheckpointManager::save(Module& model, const Optimizer& optimizer, const TrainingState& state,
                                    const std::string& config_toml, const std::optional<ModelCard>& card,
                                    const ModelEma* ema) {
  const std::string name = step_name(state.step);
  const fs::path final_path = fs::path(dir_) / name;
  const fs::path tmp = fs::path(dir_) / ("." + name + ".tmp");
  try {
    fs::create_directories(dir_);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    std::vector<std::pair<std::string, Tensor>> weights;
    for (const auto& e : model.state_dict()) weights.emplace_back(e.name, *e.tensor);
    save_with_crcs((tmp / kFiles[0]).string(), weights, card);
    save_with_crcs((tmp / kFiles[1]).string(), optimizer.state_tensors());
    if (ema) save_with_crcs((tmp / kEmaFile).string(), ema->state_tensors());
    {
      std::ofstream out(tmp / kFiles[2]);
      out << config_toml;
      out.flush();
      if (!out) throw CheckpointError((tmp / kFiles[2]).string() + ": write failed (disk full?)");
    }
    toml::table manifest{
        {"format", kFormat}, {"optimizer", optimizer.name()}, {"optimizer_steps", optimizer.step_count()}};
    manifest.insert("state", state_to_toml(state));
    if (card) manifest.insert("model_card", model_card_toml(*card));
    if (ema) manifest.insert("ema", toml::table{{"steps", ema->steps()}, {"updates", ema->updates()}});
    std::vector<const char*> written(std::begin(kFiles), std::end(kFiles));
    if (ema) written.push_back(kEmaFile);
    toml::table files;
    for (const char* f : written) {
      const std::string p = (tmp / f).string();
      fsync_path(p, false);
      files.insert(f, toml::table{{"bytes", static_cast<int64_t>(fs::file_size(p))},
                                  {"crc32c", crc32c_hex(crc32c_file(p))}});
    }
    manifest.insert("files", std::move(files));
    {
      std::ostringstream body;
      body << manifest << '\n';
      const std::string text = body.str();
      std::ofstream out(tmp / "checkpoint.toml");
      out << kManifestCrcKey << " = \"" << crc32c_hex(crc32c(text.data(), text.size())) << "\"\n" << text;
      out.flush();
      if (!out) throw CheckpointError((tmp / "checkpoint.toml").string() + ": write failed (disk full?)");
    }
    fsync_path((tmp / "checkpoint.toml").string(), false);
    fsync_path(tmp.string(), true);
    crash_here_if_asked(crash_before_rename_step_, state.step);
    if (fs::exists(final_path)) fs::remove_all(final_path);  // same step saved again (e.g. final)
    fs::rename(tmp, final_path);
    fsync_path(dir_, true);
  } catch (const std::exception& e) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw CheckpointError("checkpoint " + final_path.string() + " not written: " + e.what());
  }
  prune();
  return final_path.string();
}

int64_t checkpoint_bytes(Module& model, const Optimizer& optimizer, size_t config_bytes, bool with_ema) {
  // A safetensors header entry (name, dtype, shape, offsets) and its CRC metadata: under 256 bytes.
  constexpr int64_t kHeaderPerTensor = 256, kBlock = 4096, kManifest = 16 * 1024;
  auto blocks = [](int64_t bytes) { return (bytes + kBlock - 1) / kBlock * kBlock; };
  int64_t weights = 0, tensors = 0;
  for (const auto& e : model.state_dict()) weights += static_cast<int64_t>(e.tensor->nbytes()), ++tensors;
  int64_t state = 0, state_tensors = 0;
  const int64_t slots = static_cast<int64_t>(optimizer.state_slots().size());
  if (slots > 0)
    for (const Variable& p : model.parameters()) {
      // One tensor per slot of the parameter's size, plus its step count (Optimizer::state_tensors).
      state += slots * static_cast<int64_t>(p.data().nbytes()) + 8;
      state_tensors += slots + 1;
    }
  return (with_ema ? 2 : 1) * blocks(weights + tensors * kHeaderPerTensor) +
         blocks(state + state_tensors * kHeaderPerTensor) + blocks(static_cast<int64_t>(config_bytes)) +
         blocks(kManifest) + kBlock;  // + the directory
}

std::vector<std::string> CheckpointManager::remove_stale_temps() {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return removed;
  for (const auto& d : fs::directory_iterator(dir_)) {
    const std::string n = d.path().filename().string();
    if (d.is_directory() && n.rfind(".step-", 0) == 0 && n.ends_with(".tmp")) {
      fs::remove_all(d.path(), ec);
      removed.push_back(d.path().string());
    }
  }
  return removed;
}

void CheckpointManager::prune() {
  struct Entry {
    std::string path;
    int64_t step;
    double accuracy;
  };
  // Pruning is housekeeping after a checkpoint is safely in place: nothing here may throw and make that
  // checkpoint look failed (a directory named step-x is not ours; one that cannot be removed stays).
  std::vector<Entry> entries;
  std::error_code error;
  for (const auto& d : fs::directory_iterator(dir_, error)) {
    const std::string n = d.path().filename().string();
    if (!d.is_directory(error) || n.rfind("step-", 0) != 0 || n.size() == 5 || n.size() > 5 + 18 ||
        n.find_first_not_of("0123456789", 5) != std::string::npos)
      continue;
    double accuracy = -1;
    try {
      toml::table m = toml::parse_file((d.path() / "checkpoint.toml").string());
      accuracy =
          m["state"][config_.keep_best_on == KeepBestOn::ema ? "ema_accuracy" : "accuracy"].value_or(-1.0);
    } catch (...) {
    }
    entries.push_back({d.path().string(), std::stoll(n.substr(5)), accuracy});
  }
  std::vector<std::string> keep;
  std::sort(entries.begin(), entries.end(), [](auto& a, auto& b) { return a.step > b.step; });
  for (size_t i = 0; i < entries.size() && i < static_cast<size_t>(config_.keep_last); ++i)
    keep.push_back(entries[i].path);
  std::vector<Entry> by_acc = entries;
  std::stable_sort(by_acc.begin(), by_acc.end(), [](auto& a, auto& b) { return a.accuracy > b.accuracy; });
  for (size_t i = 0; i < by_acc.size() && i < static_cast<size_t>(config_.keep_best); ++i)
    if (by_acc[i].accuracy >= 0) keep.push_back(by_acc[i].path);
  for (const Entry& e : entries)
    if (std::find(keep.begin(), keep.end(), e.path) == keep.end()) fs::remove_all(e.path, error);
}

namespace {

// The manifest's text against the CRC-32C on its first line ("manifest_crc32c = \"<hex>\"", over the
// rest of the file). Returns whether the manifest carries one (format 1 manifests do not).
bool check_manifest_crc(const std::string& manifest_path) {
  std::ifstream in(manifest_path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  const std::string prefix = std::string(kManifestCrcKey) + " = \"";
  if (!all.starts_with(prefix)) return false;
  const size_t end_of_line = all.find('\n');
  if (end_of_line == std::string::npos || end_of_line < prefix.size() + 1)
    throw CheckpointError(manifest_path + ": corrupt manifest (its " + kManifestCrcKey + " line is cut)");
  const std::string recorded = all.substr(prefix.size(), end_of_line - prefix.size() - 1);
  const std::string body = all.substr(end_of_line + 1);
  if (recorded != crc32c_hex(crc32c(body.data(), body.size())))
    throw CheckpointError(manifest_path + ": corrupt manifest (CRC-32C mismatch: changed or damaged after " +
                          "it was written)");
  return true;
}

// What the manifest says against what it cannot be: a step other than the directory's, negative counts.
void check_state_is_sane(const TrainingState& s, int64_t optimizer_steps, const std::string& path,
                         const std::string& manifest_path) {
  const auto field_error = [&](const std::string& field, const std::string& why) {
    return CheckpointError(manifest_path + ": field '" + field + "' " + why);
  };
  const std::string dir_name = fs::path(path).filename().string();
  // step-<digits>, at most 18 of them (any such number fits an int64_t); another name is not checked.
  if (dir_name.starts_with("step-") && dir_name.size() > 5 && dir_name.size() <= 5 + 18 &&
      std::all_of(dir_name.begin() + 5, dir_name.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
      std::stoll(dir_name.substr(5)) != s.step)
    throw field_error("step", "is " + std::to_string(s.step) + " but the checkpoint's directory is " +
                                  dir_name + " (a manifest of another checkpoint, or damaged)");
  const std::pair<const char*, int64_t> counts[] = {{"step", s.step},
                                                    {"epoch", s.epoch},
                                                    {"batch_in_epoch", s.batch_in_epoch},
                                                    {"epoch_sample_offset", s.epoch_sample_offset},
                                                    {"samples_seen", s.samples_seen},
                                                    {"batch_size", s.batch_size},
                                                    {"epoch_steps", s.epoch_steps},
                                                    {"optimizer_steps", optimizer_steps}};
  for (const auto& [field, value] : counts)
    if (value < 0) throw field_error(field, "is negative (" + std::to_string(value) + ")");
  if (s.world_size < 1) throw field_error("world_size", "is " + std::to_string(s.world_size) + ", not >= 1");
}

}  // namespace

void check_position_fits(const TrainingState& s, const std::string& checkpoint_path,
                         const ResumeLimits& limits) {
  const std::string manifest_path = (fs::path(checkpoint_path) / "checkpoint.toml").string();
  const auto field_error = [&](const std::string& field, const std::string& why) {
    return CheckpointError(manifest_path + ": field '" + field + "' " + why);
  };
  if (s.epoch > limits.epochs)
    throw field_error("epoch", "is " + std::to_string(s.epoch) +
                                   " (0-based), past train.epochs = " + std::to_string(limits.epochs) +
                                   ". HINT: resume with train.epochs of at least " + std::to_string(s.epoch));
  if (s.epoch_sample_offset > limits.dataset_size)
    throw field_error("epoch_sample_offset", "is " + std::to_string(s.epoch_sample_offset) +
                                                 ", past the training set's " +
                                                 std::to_string(limits.dataset_size) + " samples");
  if (s.batch_size <= 0) return;  // nothing to measure the epoch with
  const int64_t remaining = limits.dataset_size - s.epoch_sample_offset;
  const int64_t per_rank =
      limits.drop_last ? remaining / s.world_size : (remaining + s.world_size - 1) / s.world_size;
  const int64_t batches = steps_per_epoch(per_rank, s.batch_size, limits.drop_last);
  if (s.batch_in_epoch > batches)
    throw field_error("batch_in_epoch",
                      "is " + std::to_string(s.batch_in_epoch) + ", past the epoch's " +
                          std::to_string(batches) + " batches (" + std::to_string(limits.dataset_size) +
                          " samples over " + std::to_string(s.world_size) + " rank(s) of batch " +
                          std::to_string(s.batch_size) +
                          "): resuming would skip the rest of the epoch. Is this the same dataset?");
}

TrainingState verify_checkpoint(const std::string& path) {
  const std::string manifest_path = (fs::path(path) / "checkpoint.toml").string();
  if (!fs::exists(manifest_path)) throw CheckpointError(manifest_path + ": missing (incomplete checkpoint)");
  const bool has_crc = check_manifest_crc(manifest_path);
  toml::table manifest;
  try {
    manifest = toml::parse_file(manifest_path);
  } catch (const toml::parse_error& e) {
    throw CheckpointError(manifest_path + ": unreadable manifest: " + std::string(e.description()));
  }
  const int64_t format = manifest["format"].value_or(int64_t{0});
  if (format != 1 && format != kFormat)
    throw CheckpointError(manifest_path + ": unknown checkpoint format " + std::to_string(format));
  if (format >= 2 && !has_crc)
    throw CheckpointError(manifest_path + ": corrupt manifest (its first line, " + kManifestCrcKey +
                          ", is missing)");
  std::vector<const char*> listed(std::begin(kFiles), std::end(kFiles));
  if (manifest["files"][kEmaFile].as_table()) listed.push_back(kEmaFile);
  for (const char* f : listed) {
    const std::string p = (fs::path(path) / f).string();
    const toml::table* entry = manifest["files"][f].as_table();
    if (!entry) throw CheckpointError(manifest_path + ": no entry for " + f);
    if (!fs::exists(p)) throw CheckpointError(p + ": missing");
    const int64_t bytes = (*entry)["bytes"].value_or(int64_t{-1});
    if (static_cast<int64_t>(fs::file_size(p)) != bytes)
      throw CheckpointError(p + ": " + std::to_string(fs::file_size(p)) + " bytes, the manifest says " +
                            std::to_string(bytes) + " (truncated?)");
    if (crc32c_hex(crc32c_file(p)) != (*entry)["crc32c"].value_or(std::string())) {
      // Flipped bytes inside a tensor's data: name that tensor, which says what the damage touches.
      if (p.ends_with(".safetensors")) check_tensor_crcs(p);
      throw CheckpointError(p +
                            ": corrupt (CRC-32C mismatch of the file; every tensor's own CRC matches, "
                            "so the damage is in its header or metadata)");
    }
  }
  check_tensor_crcs((fs::path(path) / kFiles[0]).string());
  check_tensor_crcs((fs::path(path) / kFiles[1]).string());
  if (listed.size() > std::size(kFiles)) check_tensor_crcs((fs::path(path) / kEmaFile).string());
  const toml::table* state = manifest["state"].as_table();
  if (!state) throw CheckpointError(manifest_path + ": no [state] table");
  TrainingState s = state_from_toml(*state, manifest_path);
  check_state_is_sane(s, manifest["optimizer_steps"].value_or(int64_t{0}), path, manifest_path);
  return s;
}

std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& dir,
                                                     std::vector<std::string>* skipped,
                                                     const ResumeLimits* limits) {
  if (!fs::is_directory(dir)) return std::nullopt;
  std::vector<std::string> candidates;
  for (const auto& d : fs::directory_iterator(dir)) {
    const std::string n = d.path().filename().string();
    if (d.is_directory() && n.rfind("step-", 0) == 0) candidates.push_back(d.path().string());
  }
  std::sort(candidates.rbegin(), candidates.rend());  // zero-padded: newest first
  for (const std::string& c : candidates) {
    try {
      CheckpointInfo info{c, verify_checkpoint(c)};
      if (limits) check_position_fits(info.state, c, *limits);
      return info;
    } catch (const CheckpointError& e) {
      if (skipped) skipped->push_back(e.what());
    }
  }
  return std::nullopt;
}

std::string remap_world_size(TrainingState& s, int64_t dataset_size, bool drop_last, int world_size,
                             int64_t batch_size, int grad_accum_steps) {
  // The current sharding covers positions offset..n-1; each rank's shard has `per_rank` of them and
  // ranks consumed the same number, so the consumed positions are offset..offset + W * taken - 1.
  const int64_t remaining = dataset_size - s.epoch_sample_offset;
  const int64_t per_rank =
      drop_last ? remaining / s.world_size : (remaining + s.world_size - 1) / s.world_size;
  const int64_t taken = std::min(per_rank, s.batch_in_epoch * s.batch_size);
  // Ranks that finished their shards finished the epoch (padding repeated samples of it; drop_last
  // skipped its tail, which must not come back as an extra step).
  const int64_t consumed = taken >= per_rank ? dataset_size : s.epoch_sample_offset + taken * s.world_size;
  const int64_t step = s.samples_seen / (batch_size * world_size * grad_accum_steps);
  char line[640];
  std::snprintf(line, sizeof line,
                "world size %d -> %d: epoch %lld continues after %lld of its %lld samples; the %lld not yet "
                "seen keep their global order and are re-sharded over %d ranks (each seen once; batches "
                "differ from an unchanged world size, so this resume is not bit-exact); step %lld -> %lld "
                "(%lld samples seen over the new global batch)",
                s.world_size, world_size, static_cast<long long>(s.epoch + 1),
                static_cast<long long>(consumed), static_cast<long long>(dataset_size),
                static_cast<long long>(dataset_size - consumed), world_size, static_cast<long long>(s.step),
                static_cast<long long>(step), static_cast<long long>(s.samples_seen));
  s.step = step;
  s.epoch_sample_offset = consumed;
  s.batch_in_epoch = 0;
  s.world_size = world_size;
  s.batch_size = batch_size;
  return line;
}

SafetensorsMetadata tensor_crc_metadata(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  SafetensorsMetadata meta;
  for (const auto& [name, t] : tensors) meta[kCrcKeyPrefix + name] = crc32c_hex(tensor_crc(t));
  return meta;
}

void save_weights(const std::string& path, Module& model, const std::optional<ModelCard>& card) {
  std::vector<std::pair<std::string, Tensor>> weights;
  for (const auto& e : model.state_dict()) weights.emplace_back(e.name, *e.tensor);
  save_with_crcs(path, weights, card);
}

namespace {

// Weights that failed their check: what to do about it.
CheckpointError bad_weights_error(const CheckpointError& e) {
  return CheckpointError(std::string(e.what()) +
                         ". HINT: copy the file again from where it came from (or use an earlier "
                         "checkpoint); --no-verify-crc evaluates it as it is");
}

}  // namespace

std::string load_weights(const std::string& path, Module& model, CrcCheck check) {
  SafetensorsFile weights;
  try {  // an unreadable file fails the check as a corrupt one does
    weights = check == CrcCheck::verify ? read_for_crc_check(path) : read_safetensors(path);
  } catch (const CheckpointError& e) {
    throw bad_weights_error(e);
  }
  return load_weights(std::move(weights), model, check);
}

std::string load_weights(SafetensorsFile weights, Module& model, CrcCheck check) {
  const std::string path = weights.path;
  std::string note = "weights " + path + ": CRC-32C not checked (--no-verify-crc)";
  if (check == CrcCheck::verify) {
    try {
      note = check_tensor_crcs(weights, true)
                 ? "weights " + path + ": every tensor matches its CRC-32C"
                 : "weights " + path + ": not verified, the file carries no CRC-32C (not written by trainer)";
    } catch (const CheckpointError& e) {
      throw bad_weights_error(e);
    }
  }
  const std::string filled_in = load_module(std::move(weights), model).note(path);
  if (!filled_in.empty()) note += "\nnote: " + filled_in;
  return note;
}

std::string checkpoint_identity(const std::string& path) {
  return crc32c_hex(crc32c_file((fs::path(path) / "checkpoint.toml").string()));
}

namespace {

// The checkpoint's weight average into `ema`; without one, the average restarts from the loaded weights.
void load_ema(const std::string& path, const toml::table& manifest, ModelEma& ema, int64_t step) {
  const fs::path file = fs::path(path) / kEmaFile;
  if (!manifest["files"][kEmaFile].as_table()) {
    ema.restart_from_model(step);
    return;
  }
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, t] : load_safetensors(file.string())) tensors.emplace_back(name, t);
  ema.load_state(tensors, manifest["ema"]["steps"].value_or(int64_t{-1}),
                 manifest["ema"]["updates"].value_or(int64_t{-1}));
}

}  // namespace

TrainingState load_checkpoint(const std::string& path, Module& model, Optimizer& optimizer, ModelEma* ema) {
  TrainingState state = verify_checkpoint(path);
  const std::string manifest_path = (fs::path(path) / "checkpoint.toml").string();
  toml::table manifest = toml::parse_file(manifest_path);
  const std::string opt_name = manifest["optimizer"].value_or(std::string());
  if (opt_name != optimizer.name())
    throw CheckpointError(path + ": holds " + opt_name + " state but the config uses " + optimizer.name() +
                          ". HINT: resume with the optimizer the checkpoint was trained with");
  try {
    load_module((fs::path(path) / kFiles[0]).string(), model);
    std::vector<std::pair<std::string, Tensor>> opt_state;
    for (auto& [name, t] : load_safetensors((fs::path(path) / kFiles[1]).string()))
      opt_state.emplace_back(name, t);
    optimizer.load_state(opt_state, manifest["optimizer_steps"].value_or(int64_t{0}));
    if (ema) load_ema(path, manifest, *ema, state.step);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": does not fit this model/optimizer: " + e.what());
  }
  return state;
}

}  // namespace trainer
