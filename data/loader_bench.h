#pragma once
// What `trainer bench-data` measures, kept apart from the command so tests can call it: how fast
// the real loader turns files into batches on this host's cores, with no model in the way. Inputs are
// generated when the user has none, so the benchmark runs anywhere.
#include <cstdint>
#include <memory>
#include <string>

#include "data/dataset.h"
#include "data/loader.h"

namespace trainer {

struct LoaderBenchPoint {
  std::string benchmark;  // "jpeg_rrc224" or "cifar_crop_flip"
  int64_t batch_size = 0;
  int workers = 0;
  int cores_used = 0;  // min(workers, cores): what the per-core rate divides by
  int64_t images = 0;
  int64_t batches = 0;
  double seconds = 0.0;

  double images_per_second() const { return seconds > 0 ? static_cast<double>(images) / seconds : 0.0; }
  double images_per_second_per_core() const {
    return cores_used > 0 ? images_per_second() / cores_used : 0.0;
  }
  double batches_per_second() const { return seconds > 0 ? static_cast<double>(batches) / seconds : 0.0; }
};

// Writes `count` size x size RGB JPEGs (quality 90) into directory/class_<k>/, two classes. The
// pictures are smooth gradients with mild noise: decode time depends on content, and pure noise
// would decode far slower than photographs do.
void write_synthetic_jpeg_folder(const std::string& directory, int64_t count, int64_t size, uint64_t seed);

// Writes a CIFAR-10 binary layout (cifar-10-batches-bin/ under directory) with train_count random
// training records spread over the five batch files and 10 test records.
void write_synthetic_cifar10(const std::string& directory, int64_t train_count, uint64_t seed);

// Loads epochs of `dataset` through a DataLoader with `options` (epoch advanced each pass, so the
// augmentations differ) until at least min_images have come out, and times it from the loader's
// construction (worker start-up included) to the last batch. cores_used = min(workers, cores), at
// least 1 (workers = 0 loads on the calling thread).
LoaderBenchPoint time_loader(const std::string& benchmark, std::shared_ptr<const Dataset> dataset,
                             LoaderOptions options, int64_t min_images, int cores);

}  // namespace trainer
