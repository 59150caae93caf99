#pragma once
// The training augmentations of data/augment/ as one pipeline on a uint8 HWC image, in place, run by
// the loader's threads after the crop and the flip (data/transforms.h), in torchvision's order:
//   policy (AutoAugment | RandAugment | TrivialAugmentWide), then ColorJitter, then RandomErasing.
// Every draw comes from the sample's Generator (seeded by seed, epoch and dataset index in the loader),
// so a sample's bytes depend on neither the thread nor the number of workers, and a resumed run sees
// the same images.
#include <cstdint>
#include <vector>

#include "data/augment/colour.h"
#include "data/augment/erasing.h"
#include "data/image_size.h"
#include "nn/random.h"

namespace trainer {

enum class AugmentPolicy { none, randaugment, trivialaugment, autoaugment };
const char* to_string(AugmentPolicy policy);

struct AugmentConfig {
  AugmentPolicy policy = AugmentPolicy::none;
  int randaugment_ops = 2;        // RandAugment's num_ops
  int randaugment_magnitude = 9;  // RandAugment's magnitude: a bin in [0, magnitude_bins)
  int magnitude_bins = 31;        // num_magnitude_bins of RandAugment and TrivialAugmentWide
  ColorJitterConfig color_jitter;
  RandomErasingConfig erasing;
  bool enabled() const {
    return policy != AugmentPolicy::none || color_jitter.enabled() || erasing.enabled();
  }
  bool operator==(const AugmentConfig&) const = default;
};

// Throws std::invalid_argument naming the field for a config the ops cannot run (the config loader
// reports the same problems against the TOML keys first).
void check_augment_config(const AugmentConfig& config);

// The whole pipeline; scratch is resized and reused across calls (one per loader thread).
void apply_augment(const AugmentConfig& config, uint8_t* hwc, ImageSize size, Generator& gen,
                   std::vector<uint8_t>& scratch);

}  // namespace trainer
