#include "app/commands/bench/bench_data_command.h"

#include <stdlib.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "app/common/build_info.h"
#include "app/common/cli.h"
#include "app/common/format.h"
#include "app/common/json_text.h"
#include "app/config/settings.h"
#include "data/cache_mode.h"
#include "data/cifar.h"
#include "data/file_cache.h"
#include "data/host_limits.h"
#include "data/image_folder.h"
#include "data/loader_bench.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

const char* kBenchDataUsage =
    "usage: trainer bench-data [--root DIR] [--images N] [--jpeg-size N] [--crop N] [--jpeg-batch N]\n"
    "                          [--cifar-samples N] [--batches 128,512] [--workers N] [--out DIR]\n"
    "                          [--cache none|encoded|decoded] [--cache-bytes N]\n"
    "                          [--augment POLICY] [--randaugment N,M] [--random-erasing P]\n\n"
    "Measures the input pipeline alone (no model) through the real DataLoader, at 1 worker and at N:\n"
    "  jpeg_rrc224      JPEG decode + RandomResizedCrop to --crop (ImageFolder, training mode); reported\n"
    "                   as images/s and images/s per core used (min(workers, cores)).\n"
    "  cifar_crop_flip  32x32x3 CIFAR-10 binary records, random crop (padding 4) + horizontal flip, per\n"
    "                   batch size; reported as batches/s and images/s.\n"
    "Inputs are generated into a temporary directory (removed afterwards) unless --root names an\n"
    "ImageFolder tree (class-per-folder JPEG/PNG) to decode instead. Each point loads whole epochs until\n"
    "it has seen at least the dataset once.\n\n"
    "  --root DIR           an ImageFolder tree for the JPEG benchmark (default: generated JPEGs)\n"
    "  --images N           generated JPEGs (default 512)\n"
    "  --jpeg-size N        side of the generated JPEGs (default 256)\n"
    "  --crop N             RandomResizedCrop output side (default 224)\n"
    "  --jpeg-batch N       batch size of the JPEG benchmark (default 32)\n"
    "  --cifar-samples N    generated CIFAR training records (default 20000)\n"
    "  --batches LIST       CIFAR batch sizes (default 128,512)\n"
    "  --workers N          the multi-worker point (default: this host's cores)\n"
    "  --cache MODE         data.cache for the JPEG benchmark (default none). With a cache, each worker\n"
    "                       count starts from an empty cache and times its first and second epochs\n"
    "                       apart: jpeg_rrc<crop>_<mode>_epoch1 (filling it), _epoch2 (reading it);\n"
    "                       with --augment, jpeg_rrc<crop>_<policy>_<mode>_epoch1/2 too (its own cache)\n"
    "  --cache-bytes N      its budget (default: a quarter of MemAvailable, as data.cache_bytes = -1)\n"
    "  --augment POLICY     none|randaugment|trivialaugment|autoaugment: with it (or --random-erasing),\n"
    "                       the JPEG benchmark also runs with [augment] after the crop and the flip, as\n"
    "                       jpeg_rrc<crop>_<policy>[_erasing], next to plain crops (data/augment/)\n"
    "  --randaugment N,M    RandAugment's num_ops and magnitude (default 2,9; 31 bins)\n"
    "  --random-erasing P   RandomErasing's probability (default 0: off; values \"random\")\n"
    "  --out DIR            output directory (default runs/bench-data-<time>)\n\n"
    "Writes loader_bench.csv and loader_bench.json (results, cores, build) into the output directory.\n\n"
    "example: trainer bench-data --out runs/bench-data\n";

struct BenchDataArgs {
  std::string root, out;
  int64_t images = 512, jpeg_size = 256, crop = 224, jpeg_batch = 32, cifar_samples = 20000;
  std::vector<int64_t> batches = {128, 512};
  int workers = 0;  // 0: the host's cores
  CacheMode cache = CacheMode::none;
  int64_t cache_bytes = -1;  // -1: default_cache_bytes
  AugmentConfig augment;     // the JPEG benchmark's augmented run; not enabled() = none
  bool help = false;
};

int64_t positive(const std::string& flag, const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || v < 1)
    throw UsageError(flag + " expects a positive whole number, got '" + text + "'");
  return v;
}

double probability(const std::string& flag, const std::string& text) {
  double v = -1;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || !(v >= 0 && v <= 1))
    throw UsageError(flag + " expects a probability in [0, 1], got '" + text + "'");
  return v;
}

// --augment, --randaugment and --random-erasing into args.augment; false for any other flag.
bool parse_augment_flag(const std::string& flag, ArgWalker& w, BenchDataArgs& a) {
  if (flag == "--augment") {
    const std::string value = w.value();
    const auto policy = parse_setting<AugmentPolicy>(value);
    if (!policy)
      throw UsageError("--augment: one of none, randaugment, trivialaugment, autoaugment; got '" + value +
                       "'");
    a.augment.policy = *policy;
  } else if (flag == "--randaugment") {
    const std::string value = w.value();
    const size_t comma = value.find(',');
    if (comma == std::string::npos) throw UsageError("--randaugment expects N,M, got '" + value + "'");
    a.augment.randaugment_ops = static_cast<int>(positive(flag, value.substr(0, comma)));
    const std::string magnitude = value.substr(comma + 1);
    a.augment.randaugment_magnitude = magnitude == "0" ? 0 : static_cast<int>(positive(flag, magnitude));
    if (a.augment.randaugment_magnitude >= a.augment.magnitude_bins)
      throw UsageError("--randaugment: the magnitude must be < 31");
  } else if (flag == "--random-erasing") {
    a.augment.erasing.probability = probability(flag, w.value());
    a.augment.erasing.value = ErasingValue::random;
  } else {
    return false;
  }
  return true;
}

BenchDataArgs parse(const std::vector<std::string>& args) {
  BenchDataArgs a;
  ArgWalker w(args);  // "--flag value" and "--flag=value" alike, as every other command
  while (w.next()) {
    const std::string& flag = w.arg();
    if (parse_augment_flag(flag, w, a)) continue;
    if (flag == "--help" || flag == "-h")
      a.help = true;
    else if (flag == "--root")
      a.root = w.value();
    else if (flag == "--out")
      a.out = w.value();
    else if (flag == "--images")
      a.images = positive(flag, w.value());
    else if (flag == "--jpeg-size")
      a.jpeg_size = positive(flag, w.value());
    else if (flag == "--crop")
      a.crop = positive(flag, w.value());
    else if (flag == "--jpeg-batch")
      a.jpeg_batch = positive(flag, w.value());
    else if (flag == "--cifar-samples")
      a.cifar_samples = positive(flag, w.value());
    else if (flag == "--cache") {
      try {
        a.cache = parse_cache_mode(w.value());
      } catch (const std::invalid_argument& e) {
        throw UsageError(std::string("--cache: ") + e.what());
      }
    } else if (flag == "--cache-bytes")
      a.cache_bytes = positive(flag, w.value());
    else if (flag == "--workers")
      a.workers = static_cast<int>(positive(flag, w.value()));
    else if (flag == "--batches") {
      a.batches.clear();
      std::stringstream list(w.value());
      for (std::string item; std::getline(list, item, ',');) a.batches.push_back(positive(flag, item));
      if (a.batches.empty()) throw UsageError("--batches needs at least one batch size");
    } else if (flag.rfind("-", 0) == 0) {
      throw UsageError("unknown option " + flag);
    } else {
      throw UsageError("unexpected argument '" + flag + "' (bench-data takes no CONFIG; see --help)");
    }
  }
  if (a.cifar_samples < 5) throw UsageError("--cifar-samples must be at least 5 (one per batch file)");
  return a;
}

// A fresh directory under $TMPDIR, removed with everything in it when the benchmark ends.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "trainer-bench-data-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr)
      throw std::runtime_error("cannot create a directory in " + pattern);
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string default_out_dir() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
  return std::string("runs/bench-data-") + stamp;
}

void write_csv(const fs::path& path, const std::vector<LoaderBenchPoint>& points) {
  std::ofstream out(path);
  out << "benchmark,batch_size,workers,cores_used,images,batches,seconds,images_per_s,images_per_s_per_core,"
         "batches_per_s\n";
  for (const auto& p : points)
    out << p.benchmark << ',' << p.batch_size << ',' << p.workers << ',' << p.cores_used << ',' << p.images
        << ',' << p.batches << ',' << fmt("%.4f", p.seconds) << ',' << fmt("%.1f", p.images_per_second())
        << ',' << fmt("%.1f", p.images_per_second_per_core()) << ',' << fmt("%.2f", p.batches_per_second())
        << '\n';
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

// "randaugment2m9_erasing0.25" for the benchmark's name and the JSON; "none" without augmentation.
std::string augment_label(const AugmentConfig& augment) {
  std::string label;
  if (augment.policy == AugmentPolicy::randaugment)
    label = fmt("randaugment%dm%d", augment.randaugment_ops, augment.randaugment_magnitude);
  else if (augment.policy != AugmentPolicy::none)
    label = to_string(augment.policy);
  if (augment.erasing.enabled())
    label += (label.empty() ? "" : "_") + fmt("erasing%g", augment.erasing.probability);
  return label.empty() ? "none" : label;
}

void write_json(const fs::path& path, const std::vector<LoaderBenchPoint>& points, const BenchDataArgs& a,
                unsigned cores, const std::string& jpeg_source) {
  nlohmann::ordered_json js;
  js["build"] = trainer_build().str();
  js["cpu_cores"] = cores;
  js["jpeg_source"] = jpeg_source;
  js["jpeg_size"] = a.jpeg_size;
  js["crop"] = a.crop;
  js["cache"] = to_string(a.cache);
  js["augment"] = augment_label(a.augment);
  js["results"] = nlohmann::ordered_json::array();
  for (const auto& p : points) {
    nlohmann::ordered_json j;
    j["benchmark"] = p.benchmark;
    j["batch_size"] = p.batch_size;
    j["workers"] = p.workers;
    j["cores_used"] = p.cores_used;
    j["images"] = p.images;
    j["batches"] = p.batches;
    j["seconds"] = rounded(p.seconds, 4);
    j["images_per_s"] = rounded(p.images_per_second(), 1);
    j["images_per_s_per_core"] = rounded(p.images_per_second_per_core(), 1);
    j["batches_per_s"] = rounded(p.batches_per_second(), 2);
    js["results"].push_back(std::move(j));
  }
  std::ofstream out(path);
  out << json_text(js);
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void print_table(const std::vector<LoaderBenchPoint>& points) {
  int name_width = 16;  // the cached benchmarks' names are longer
  for (const auto& p : points) name_width = std::max(name_width, static_cast<int>(p.benchmark.size()));
  std::printf("%-*s %6s %7s %5s %8s %8s %10s %13s %10s\n", name_width, "benchmark", "batch", "workers",
              "cores", "images", "seconds", "images/s", "images/s/core", "batches/s");
  for (const auto& p : points)
    std::printf("%-*s %6lld %7d %5d %8lld %8.2f %10.1f %13.1f %10.2f\n", name_width, p.benchmark.c_str(),
                static_cast<long long>(p.batch_size), p.workers, p.cores_used,
                static_cast<long long>(p.images), p.seconds, p.images_per_second(),
                p.images_per_second_per_core(), p.batches_per_second());
}

// --root as given, or JPEGs generated into the scratch directory when there is none.
std::string jpeg_input_dir(const BenchDataArgs& a, const ScratchDir& scratch) {
  if (!a.root.empty()) return a.root;
  const std::string jpeg_dir = (scratch.path() / "jpeg").string();
  std::printf("writing %lld %lldx%lld JPEGs to %s\n", static_cast<long long>(a.images),
              static_cast<long long>(a.jpeg_size), static_cast<long long>(a.jpeg_size), jpeg_dir.c_str());
  std::fflush(stdout);
  write_synthetic_jpeg_folder(jpeg_dir, a.images, a.jpeg_size, 1);
  return jpeg_dir;
}

// JPEG decode + RandomResizedCrop, and with --augment the same followed by the augmentations; with a
// cache, each one's filling and reading epochs apart.
std::vector<LoaderBenchPoint> bench_jpeg(const BenchDataArgs& a, const std::string& jpeg_dir,
                                         const std::vector<int>& worker_counts, unsigned cores) {
  std::vector<LoaderBenchPoint> points;
  ImageFolderOptions folder;
  folder.image_size = a.crop;
  folder.train = true;
  const std::string jpeg_benchmark = "jpeg_rrc" + std::to_string(a.crop);
  if (a.cache != CacheMode::none) {
    folder.cache_mode = a.cache;
    folder.cache.budget_bytes =
        a.cache_bytes > 0 ? a.cache_bytes : default_cache_bytes(this_host_limits().available_memory);
  }
  // Plain crops, and the same crops followed by --augment's pipeline (with the flip, as a recipe has it).
  std::vector<std::pair<std::string, TransformConfig>> variants = {{jpeg_benchmark, {}}};
  if (a.augment.enabled()) {
    TransformConfig augmented;
    augmented.horizontal_flip = true;
    augmented.augment = a.augment;
    variants.emplace_back(jpeg_benchmark + "_" + augment_label(a.augment), augmented);
  }
  for (int workers : worker_counts)
    for (const auto& [name, transforms] : variants) {
      LoaderOptions lo;
      lo.batch_size = a.jpeg_batch;
      lo.num_workers = workers;
      lo.seed = 1;
      lo.transforms = transforms;
      // A fresh dataset per point: a cache filled by the previous point would flatter the first epoch.
      const auto images = std::make_shared<ImageFolder>(jpeg_dir, folder);
      if (a.cache == CacheMode::none) {
        points.push_back(time_loader(name, images, lo, images->size(), static_cast<int>(cores)));
        continue;
      }
      // The cache sits under the crop: --augment's pipeline runs on every epoch's cached decode.
      for (int epoch = 0; epoch < 2; ++epoch) {
        lo.epoch = epoch;
        points.push_back(time_loader(name + "_" + to_string(a.cache) + "_epoch" + std::to_string(epoch + 1),
                                     images, lo, images->size(), static_cast<int>(cores)));
      }
      std::printf("%d workers, %s: data.cache = \"%s\" holds %lld of %lld files, %.1f MB\n", workers,
                  name.c_str(), to_string(a.cache), static_cast<long long>(images->cache()->files()),
                  static_cast<long long>(images->size()),
                  static_cast<double>(images->cache()->bytes()) / 1e6);
    }
  return points;
}

// CIFAR-shaped batches with crop + flip, at every batch size.
std::vector<LoaderBenchPoint> bench_cifar(const BenchDataArgs& a, const ScratchDir& scratch,
                                          const std::vector<int>& worker_counts, unsigned cores) {
  std::vector<LoaderBenchPoint> points;
  const std::string cifar_dir = (scratch.path() / "cifar").string();
  write_synthetic_cifar10(cifar_dir, a.cifar_samples, 2);
  const auto cifar = std::make_shared<Cifar>(CifarVariant::cifar10, cifar_dir, "train");
  for (int64_t batch : a.batches)
    for (int workers : worker_counts) {
      LoaderOptions lo;
      lo.batch_size = batch;
      lo.transforms.crop_padding = 4;
      lo.transforms.horizontal_flip = true;
      lo.num_workers = workers;
      lo.seed = 1;
      points.push_back(time_loader("cifar_crop_flip", cifar, lo, cifar->size(), static_cast<int>(cores)));
    }
  return points;
}

}  // namespace

int bench_data_command(const std::vector<std::string>& args) {
  const BenchDataArgs a = parse(args);
  if (a.help) {
    std::fputs(kBenchDataUsage, stdout);
    return 0;
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int many = a.workers > 0 ? a.workers : static_cast<int>(cores);
  std::vector<int> worker_counts = {1};
  if (many != 1) worker_counts.push_back(many);
  const fs::path out_dir = a.out.empty() ? fs::path(default_out_dir()) : fs::path(a.out);
  fs::create_directories(out_dir);
  ScratchDir scratch;

  const std::string jpeg_source = a.root.empty() ? "generated" : a.root;
  std::vector<LoaderBenchPoint> points = bench_jpeg(a, jpeg_input_dir(a, scratch), worker_counts, cores);
  const std::vector<LoaderBenchPoint> cifar_points = bench_cifar(a, scratch, worker_counts, cores);
  points.insert(points.end(), cifar_points.begin(), cifar_points.end());

  print_table(points);
  write_csv(out_dir / "loader_bench.csv", points);
  write_json(out_dir / "loader_bench.json", points, a, cores, jpeg_source);
  std::printf("wrote %s and %s\n", (out_dir / "loader_bench.csv").c_str(),
              (out_dir / "loader_bench.json").c_str());
  return 0;
}

}  // namespace trainer
