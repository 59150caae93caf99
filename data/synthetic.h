#pragma once
// A dataset computed, not read: each sample's label and pixels are a pure function of (seed, index),
// so it costs no memory or I/O and every rank sees the same data without sharing files. Meant for
// benchmarks and tests. The label sets each image's mean brightness (noise around a per-class level),
// so a model can learn it and a falling loss shows the pipeline is wired correctly.
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace trainer {

struct SyntheticConfig {
  int64_t size = 50000;
  int64_t channels = 3;
  int64_t height = 32;
  int64_t width = 32;
  int64_t num_classes = 10;
  uint64_t seed = 0;
};

class SyntheticDataset : public Dataset {
 public:
  // Throws DataError when a dimension is not positive or num_classes is outside [1, 256].
  explicit SyntheticDataset(const SyntheticConfig& config);

  std::string name() const override { return "synthetic"; }
  int64_t size() const override { return config_.size; }
  int64_t num_classes() const override { return config_.num_classes; }
  int64_t channels() const override { return config_.channels; }
  int64_t height() const override { return config_.height; }
  int64_t width() const override { return config_.width; }
  const std::vector<std::string>& class_names() const override { return class_names_; }
  // The exact expected pixel mean and standard deviation (the same for every channel).
  Normalization normalization() const override;
  void read_into(int64_t index, uint8_t* hwc_out) const override;
  int64_t label(int64_t index) const override;
  std::string fingerprint() const override;

 private:
  // Pixels are level + noise: half the range is a per-class level (k * 128 / K), half noise in [0, 127].
  int class_level(int64_t label) const;

  SyntheticConfig config_;
  std::vector<std::string> class_names_;  // "class_0", "class_1", ...
};

}  // namespace trainer
