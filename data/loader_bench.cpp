#include "data/loader_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "data/cifar.h"
#include "data/image_codec.h"
#include "nn/random.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace

void write_synthetic_jpeg_folder(const std::string& directory, int64_t count, int64_t size, uint64_t seed) {
  Generator gen(seed);
  std::vector<uint8_t> rgb(static_cast<size_t>(size * size * 3));
  for (int64_t i = 0; i < count; ++i) {
    const fs::path dir = fs::path(directory) / ("class_" + std::to_string(i % 2));
    fs::create_directories(dir);
    // A gradient with a per-image direction and colour, plus noise of +-8.
    const double gx = gen.uniform() * 2.0, gy = gen.uniform() * 2.0;
    const double base[3] = {gen.uniform() * 128, gen.uniform() * 128, gen.uniform() * 128};
    for (int64_t y = 0; y < size; ++y)
      for (int64_t x = 0; x < size; ++x)
        for (int c = 0; c < 3; ++c) {
          const double v = base[c] + (gx * x + gy * y) * (c + 1) / 6.0 + (gen.uniform() - 0.5) * 16.0;
          rgb[static_cast<size_t>((y * size + x) * 3 + c)] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
        }
    char name[32];
    std::snprintf(name, sizeof name, "img_%06lld.jpg", static_cast<long long>(i));
    write_file(dir / name, encode_jpeg(rgb.data(), size, size, 3, 90));
  }
}

void write_synthetic_cifar10(const std::string& directory, int64_t train_count, uint64_t seed) {
  const fs::path dir = fs::path(directory) / "cifar-10-batches-bin";
  fs::create_directories(dir);
  Generator gen(seed);
  const auto records = [&](int64_t n) {
    std::vector<uint8_t> bytes(static_cast<size_t>(n * (1 + Cifar::kImageBytes)));
    for (int64_t r = 0; r < n; ++r) {
      uint8_t* record = bytes.data() + r * (1 + Cifar::kImageBytes);
      record[0] = static_cast<uint8_t>(gen.next_u64() % 10);
      for (int64_t p = 1; p <= Cifar::kImageBytes; ++p) record[p] = static_cast<uint8_t>(gen.next_u64());
    }
    return bytes;
  };
  for (int64_t f = 0; f < 5; ++f) {
    // Five files, as the real layout has; the first takes the remainder.
    const int64_t n = train_count / 5 + (f == 0 ? train_count % 5 : 0);
    write_file(dir / ("data_batch_" + std::to_string(f + 1) + ".bin"), records(n));
  }
  write_file(dir / "test_batch.bin", records(10));
}

LoaderBenchPoint time_loader(const std::string& benchmark, std::shared_ptr<const Dataset> dataset,
                             LoaderOptions options, int64_t min_images, int cores) {
  if (dataset->size() == 0) throw std::invalid_argument("time_loader: the dataset is empty");
  std::vector<int64_t> indices(static_cast<size_t>(dataset->size()));
  for (int64_t i = 0; i < dataset->size(); ++i) indices[static_cast<size_t>(i)] = i;
  LoaderBenchPoint point;
  point.benchmark = benchmark;
  point.batch_size = options.batch_size;
  point.workers = options.num_workers;
  point.cores_used = std::max(1, std::min(options.num_workers, cores));
  const auto start = std::chrono::steady_clock::now();
  while (point.images < min_images) {
    DataLoader loader(dataset, indices, options);
    while (std::optional<Batch> batch = loader.next()) {
      point.images += batch->labels.numel();
      ++point.batches;
    }
    ++options.epoch;
  }
  point.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return point;
}

}  // namespace trainer
