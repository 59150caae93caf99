#include "app/run/datasets.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>

#include "app/run/loader_workers.h"
#include "data/cifar.h"
#include "data/data_error.h"
#include "data/fashion_mnist.h"
#include "data/image_folder.h"
#include "data/path_check.h"
#include "data/synthetic.h"
#include "dist/process_env.h"
#include "metrics/log.h"

namespace trainer {

namespace {

namespace fs = std::filesystem;

// "dataset directory 'root' does not exist. HINT: ..."; the hint (install, download) only where the
// path is missing or not a directory, not where it exists but cannot be read (permission denied).
std::string directory_problem(const std::string& root, const PathCheck& check, const std::string& hint) {
  std::string message = "dataset directory '" + root + "' " + check.reason;
  if (check.problem != PathProblem::unreachable) message += ". HINT: " + hint;
  return message;
}

// The datasets without a default location: data.root must name an existing directory.
std::string required_root(const Config& config, const std::string& hint) {
  const std::string& root = config.data.root;
  if (root.empty())
    throw config_error_at(config, "data.root",
                          "dataset '" + config.data.dataset + "' needs data.root. HINT: " + hint);
  const PathCheck dir = check_directory(root);
  if (!dir) throw config_error_at(config, "data.root", directory_problem(root, dir, hint));
  return root;
}

// data.image_size resizes image_folder samples only. The datasets stored at one size accept 0 or that
// size, and refuse another rather than silently train at their own.
// `source` says where the native size comes from, when a key sets it.
void check_native_image_size(const Config& config, const std::string& what, int native,
                             const std::string& source, const std::string& hint) {
  const int asked = config.data.image_size;
  if (asked == 0 || asked == native) return;
  throw config_error_at(config, "data.image_size",
                        what + " images are " + std::to_string(native) + "x" + std::to_string(native) +
                            source + " and are not resized. HINT: " + hint);
}

Datasets open_cifar(const Config& config, CifarVariant variant) {
  const bool ten = variant == CifarVariant::cifar10;
  const std::string root = required_root(
      config, std::string("download the binary version (") +
                  (ten ? "cifar-10-binary.tar.gz" : "cifar-100-binary.tar.gz") +
                  ") from https://www.cs.toronto.edu/~kriz/cifar.html, extract it and set data.root to the " +
                  (ten ? "cifar-10-batches-bin" : "cifar-100-binary") + " directory");
  check_native_image_size(config, "CIFAR", 32, "", "remove data.image_size or set it to 0");
  try {
    return {std::make_shared<Cifar>(variant, root, "train"), std::make_shared<Cifar>(variant, root, "test")};
  } catch (const DataError& e) {
    throw config_error_at(config, "data.root", e.what());
  }
}

// data.cache and data.cache_bytes for this rank: one cache per node in shared memory, named by the job,
// when the node runs several ranks.
FileCacheOptions file_cache_options(const Config& config) {
  FileCacheOptions cache;
  if (config.data.cache == CacheMode::none) return cache;
  cache.budget_bytes = config.data.cache_bytes >= 0
                           ? config.data.cache_bytes
                           : default_cache_bytes(this_host_limits().available_memory);
  const ProcessEnv env = process_env();
  if (env.local_world_size > 1) {
    std::string job = env.job_id.empty() ? std::to_string(env.master_port) + "-" +
                                               std::to_string(::getppid())  // the launcher's
                                         : env.job_id;
    for (char& c : job)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.') c = '_';
    cache.shared_name = "/trainer-cache-" + job;
    cache.create = env.local_rank == 0;
    cache.sharers = env.local_world_size;
  }
  return cache;
}

// <root>/train/<class>/ for training and <root>/val/<class>/ (or test/) for evaluation. A flat
// <root>/<class>/ tree is refused rather than evaluated on its own training images.
Datasets open_image_folder(const Config& config) {
  const std::string layout_hint =
      "an image folder is <root>/train/<class>/*.jpg and <root>/val/<class>/*.jpg "
      "(JPEG or PNG)";
  const fs::path root = required_root(config, "set data.root to a directory laid out as " + layout_hint);
  const fs::path train_dir = root / "train";
  fs::path eval_dir = root / "val";
  if (check_directory(eval_dir).problem == PathProblem::missing && check_directory(root / "test"))
    eval_dir = root / "test";
  for (const fs::path& dir : {train_dir, eval_dir}) {
    const PathCheck check = check_directory(dir);
    if (check.problem == PathProblem::unreachable)
      throw config_error_at(config, "data.root", "'" + dir.string() + "' " + check.reason);
    if (!check)
      throw config_error_at(config, "data.root",
                            "'" + root.string() + "' has no " + dir.filename().string() +
                                "/ directory. HINT: " + layout_hint +
                                "; a flat <root>/<class>/ tree has no held-out split: move some " +
                                "images of each class to <root>/val/<class>/");
  }
  const int in_channels = config.model.in_channels;
  if (in_channels != 0 && in_channels != 1 && in_channels != 3)
    throw config_error_at(
        config, "model.in_channels",
        "image_folder decodes images to 1 (grey) or 3 (RGB) channels, not " + std::to_string(in_channels));
  ImageFolderOptions options;
  options.image_size = config.data.image_size > 0 ? config.data.image_size : 224;
  options.channels = in_channels > 0 ? in_channels : 3;
  options.warn = [](const std::string& message) { Log::instance().error(message); };
  options.bad_samples = config.data.bad_samples;
  options.cache = file_cache_options(config);
  options.cache_mode = config.data.cache;
  const int64_t cache_budget = options.cache.budget_bytes;
  try {
    options.train = true;
    auto train = std::make_shared<ImageFolder>(train_dir.string(), options);
    options.train = false;
    options.drop_bad_samples = true;         // evaluate every readable image once, none in a bad one's place
    options.classes = train->class_names();  // the same labels, even if a class has no evaluation images
    // The evaluation split gets what the training split leaves of the budget.
    if (train->cache())
      options.cache.budget_bytes =
          std::max<int64_t>(0, cache_budget - static_cast<int64_t>(train->cache()->capacity()));
    auto test = std::make_shared<ImageFolder>(eval_dir.string(), options);
    for (const FileCache* cache : {train->cache(), test->cache()})
      if (cache && !cache->fallback_reason().empty())
        Log::instance().error("warning: data.cache: " + cache->fallback_reason());
    return {train, test};
  } catch (const DataError& e) {
    throw config_error_at(config, "data.root", e.what());
  }
}

Datasets open_datasets_unchecked(const Config& config) {
  const DataConfig& d = config.data;
  if (d.dataset == "synthetic") {
    check_native_image_size(config, "synthetic", d.synthetic_image_size, " (data.synthetic_image_size)",
                            "set data.synthetic_image_size = " + std::to_string(d.image_size) +
                                " instead, or remove data.image_size");
    SyntheticConfig s;
    s.size = d.synthetic_samples;
    s.channels = config.model.in_channels > 0 ? config.model.in_channels : 3;
    s.height = s.width = d.synthetic_image_size;
    s.num_classes = d.synthetic_classes;
    s.seed = static_cast<uint64_t>(config.train.seed);
    SyntheticConfig test = s;
    test.size = std::max<int64_t>(1, s.size / 5);
    test.seed = s.seed + 1;
    return {std::make_shared<SyntheticDataset>(s), std::make_shared<SyntheticDataset>(test)};
  }
  if (d.dataset == "fashion_mnist") {
    check_native_image_size(config, "Fashion-MNIST", 28, "", "remove data.image_size or set it to 0");
    const std::string root = d.root.empty() ? kFashionMnistDefaultRoot : d.root;
    const PathCheck dir = check_directory(root);
    if (!dir)
      throw config_error_at(
          config, "data.root",
          directory_problem(root, dir,
                            d.root.empty() ? "apt-get install dataset-fashion-mnist, or set data.root"
                                           : "fix data.root, or remove it to use " +
                                                 std::string(kFashionMnistDefaultRoot)));
    try {
      return {std::make_shared<FashionMnist>(root, "train"), std::make_shared<FashionMnist>(root, "test")};
    } catch (const DataError& e) {
      throw config_error_at(config, "data.root", e.what());
    }
  }
  if (d.dataset == "cifar10") return open_cifar(config, CifarVariant::cifar10);
  if (d.dataset == "cifar100") return open_cifar(config, CifarVariant::cifar100);
  if (d.dataset == "image_folder") return open_image_folder(config);
  throw config_error_at(config, "data.dataset",
                        "dataset '" + d.dataset + "' is not available (available: fashion_mnist, cifar10, " +
                            "cifar100, image_folder, synthetic)");
}

}  // namespace

std::string data_cache_report(const Datasets& data) {
  std::string report;
  for (const auto& [split, dataset] :
       {std::pair{"training", data.train.get()}, std::pair{"evaluation", data.test.get()}}) {
    const auto* folder = dynamic_cast<const ImageFolder*>(dataset);
    const FileCache* cache = folder ? folder->cache() : nullptr;
    if (!cache) continue;
    const std::string mode = to_string(folder->cache_mode());
    report += (report.empty() ? "data.cache = \"" + mode + "\": " : std::string("; ")) + split + " " +
              std::to_string(cache->files()) + " of " + std::to_string(folder->size()) + " files, " +
              format_bytes(static_cast<double>(cache->bytes())) + " of " +
              format_bytes(static_cast<double>(cache->capacity())) + " (files " +
              format_bytes(static_cast<double>(folder->listed_bytes())) + ")" +
              (cache->shared() ? ", shared by the node's ranks" : ", this rank's own");
  }
  return report;
}

const FileCache* data_cache_of(const Dataset* dataset) {
  const auto* folder = dynamic_cast<const ImageFolder*>(dataset);
  return folder ? folder->cache() : nullptr;
}

Datasets open_datasets(const Config& config, int local_world_size) {
  Datasets data = open_datasets_unchecked(config);
  check_data_fits_host(config, data, this_host_limits(), local_world_size);
  return data;
}

namespace {

void check_worker_count(const Config& config, const HostLimits& host) {
  const DataConfig& d = config.data;
  const int64_t most_workers = max_loader_workers(host);
  if (d.workers > most_workers)
    throw config_error_at(
        config, "data.workers",
        "is " + std::to_string(d.workers) + ", more loader threads than this host can run: at most " +
            std::to_string(most_workers) + " (8 per core on " + std::to_string(host.cores) +
            " cores, at least 64" +
            (host.max_user_threads > 0
                 ? ", and half of RLIMIT_NPROC (" + std::to_string(host.max_user_threads) + ")"
                 : std::string()) +
            "). HINT: set data.workers = -1 to share the cores between the node's ranks");
}

void check_batch_within_training_set(const Config& config, const Dataset& train) {
  const DataConfig& d = config.data;
  const int64_t train_size = train.size();
  if (!d.drop_last && d.batch_size > train_size)
    throw config_error_at(
        config, "data.batch_size",
        "is " + std::to_string(d.batch_size) + ", larger than the " + std::to_string(train_size) +
            " samples of the training set (" + train.name() +
            "): with data.drop_last = false every step would take the whole set as one batch. HINT: set "
            "data.batch_size to at most " +
            std::to_string(train_size));
}

// Half of the host's memory (the rest: model, activations), shared by the node's ranks, which all
// run this check against the same MemAvailable.
struct MemoryBudget {
  double bytes = 0;
  std::string available;  // for the messages: MemAvailable and who shares it
};

MemoryBudget rank_memory_budget(const HostLimits& host, int local_world_size) {
  const int64_t local_ranks = std::max(1, local_world_size);
  const double budget = 0.5 * static_cast<double>(host.available_memory) / static_cast<double>(local_ranks);
  const std::string available =
      format_bytes(static_cast<double>(host.available_memory)) +
      (local_ranks > 1 ? " (shared by this node's " + std::to_string(local_ranks) + " ranks)"
                       : std::string());
  return {budget, available};
}

// The sampler's epoch order and this rank's share of it, and the evaluation shard: 8 bytes an index.
void check_index_memory(const Config& config, const Datasets& data, const MemoryBudget& budget) {
  const int64_t train_size = data.train->size(), test_size = data.test->size();
  const double index_bytes = 8.0 * (2.0 * static_cast<double>(train_size) + static_cast<double>(test_size));
  if (index_bytes <= budget.bytes) return;
  const bool synthetic = config.data.dataset == "synthetic";
  throw config_error_at(
      config, synthetic ? "data.synthetic_samples" : "data.root",
      "the " + std::to_string(train_size) + " training and " + std::to_string(test_size) +
          " test samples need " + format_bytes(index_bytes) +
          " of sample indices (8 bytes each, twice for the training order), more than half of the " +
          budget.available + " of memory available on this host. HINT: " +
          (synthetic ? "lower data.synthetic_samples" : "use a smaller dataset or a host with more memory"));
}

// The loader's queue: data.prefetch_batches, at least one per worker.
int64_t queued_batches(const Config& config, int local_world_size) {
  const DataConfig& d = config.data;
  const int64_t workers =
      d.workers < 0 ? default_loader_workers(config, local_world_size) : std::max(d.workers, 1);
  return std::max<int64_t>(d.prefetch_batches > 0 ? d.prefetch_batches : 2 * workers, workers);
}

// Batches in flight: the queued ones and the one in use as uint8, plus the float32 copy the step
// normalises it into (4 bytes a value).
void check_batch_memory(const Config& config, const char* key, int64_t batch_size, const Dataset& dataset,
                        int64_t queued, const MemoryBudget& budget) {
  const int64_t batch = std::min(batch_size, dataset.size());
  const double bytes = static_cast<double>(batch) * static_cast<double>(dataset.sample_bytes()) *
                       (static_cast<double>(queued + 1) + 4.0);
  if (bytes <= budget.bytes) return;
  throw config_error_at(config, key,
                        std::to_string(queued + 1) + " batches of " + std::to_string(batch) + " images of " +
                            std::to_string(dataset.height()) + "x" + std::to_string(dataset.width()) + "x" +
                            std::to_string(dataset.channels()) + " in flight and one as float32 need " +
                            format_bytes(bytes) + ", more than half of the " + budget.available +
                            " of memory available on this host. HINT: lower " + key +
                            " (or data.prefetch_batches)");
}

}  // namespace

void check_data_fits_host(const Config& config, const Datasets& data, const HostLimits& host,
                          int local_world_size) {
  check_worker_count(config, host);
  check_batch_within_training_set(config, *data.train);
  if (host.available_memory <= 0) return;  // unknown: nothing to compare with
  const MemoryBudget budget = rank_memory_budget(host, local_world_size);
  check_index_memory(config, data, budget);
  const int64_t queued = queued_batches(config, local_world_size);
  check_batch_memory(config, "data.batch_size", config.data.batch_size, *data.train, queued, budget);
  check_batch_memory(config, "data.eval_batch_size", config.data.eval_batch_size, *data.test, queued, budget);
}

Normalization resolved_normalization(const Config& config, const Dataset& dataset) {
  if (config.data.normalize_mean.empty()) return dataset.normalization();
  Normalization n;
  for (double m : config.data.normalize_mean) n.mean.push_back(static_cast<float>(m));
  for (double s : config.data.normalize_std) n.std.push_back(static_cast<float>(s));
  return n;
}

}  // namespace trainer
