#include "data/synthetic.h"

#include <algorithm>
#include <cmath>

#include "data/data_error.h"
#include "data/hash.h"

namespace trainer {

namespace {
// Distinct stream tags so that the label and the pixels of a sample draw independent numbers.
constexpr uint64_t kLabelStream = 1, kPixelStream = 2;
}  // namespace

SyntheticDataset::SyntheticDataset(const SyntheticConfig& config) : config_(config) {
  if (config.size < 0 || config.channels <= 0 || config.height <= 0 || config.width <= 0) {
    throw DataError("synthetic: size must be >= 0 and channels, height, width positive; got size " +
                    std::to_string(config.size) + ", " + std::to_string(config.channels) + "x" +
                    std::to_string(config.height) + "x" + std::to_string(config.width));
  }
  if (config.num_classes < 1 || config.num_classes > 256) {
    throw DataError("synthetic: num_classes must lie in [1, 256], got " + std::to_string(config.num_classes));
  }
  for (int64_t k = 0; k < config.num_classes; ++k) class_names_.push_back("class_" + std::to_string(k));
}

int SyntheticDataset::class_level(int64_t label) const {
  return static_cast<int>(label * 128 / config_.num_classes);
}

Normalization SyntheticDataset::normalization() const {
  // Exact moments of level + noise, with labels uniform over the classes and noise uniform in [0, 127].
  double level_mean = 0.0, level_square = 0.0;
  for (int64_t k = 0; k < config_.num_classes; ++k) {
    level_mean += class_level(k);
    level_square += static_cast<double>(class_level(k)) * class_level(k);
  }
  level_mean /= static_cast<double>(config_.num_classes);
  level_square /= static_cast<double>(config_.num_classes);
  const double noise_mean = 63.5, noise_variance = (128.0 * 128.0 - 1.0) / 12.0;
  const double mean = (level_mean + noise_mean) / 255.0;
  const double stddev = std::sqrt(level_square - level_mean * level_mean + noise_variance) / 255.0;
  const size_t c = static_cast<size_t>(config_.channels);
  return {std::vector<float>(c, static_cast<float>(mean)), std::vector<float>(c, static_cast<float>(stddev))};
}

int64_t SyntheticDataset::label(int64_t index) const {
  check_index(index);
  const uint64_t draw = mix_seed(config_.seed, kLabelStream, static_cast<uint64_t>(index));
  return static_cast<int64_t>(draw % static_cast<uint64_t>(config_.num_classes));
}

void SyntheticDataset::read_into(int64_t index, uint8_t* hwc_out) const {
  const int64_t k = label(index);  // also checks the index
  const int level = class_level(k);
  uint64_t state = mix_seed(config_.seed, kPixelStream, static_cast<uint64_t>(index));
  const int64_t bytes = sample_bytes();
  for (int64_t i = 0; i < bytes; i += 8) {
    state += 0x9e3779b97f4a7c15ull;  // a splitmix64 stream: each step hashes the next counter value
    uint64_t bits = splitmix64(state);
    for (int64_t j = i; j < std::min(i + 8, bytes); ++j, bits >>= 8) {
      hwc_out[j] = static_cast<uint8_t>(level + static_cast<int>((bits & 0xff) >> 1));
    }
  }
}

std::string SyntheticDataset::fingerprint() const { return describe(mix_seed(config_.seed, kPixelStream)); }

}  // namespace trainer
