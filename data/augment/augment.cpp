#include "data/augment/augment.h"

#include <stdexcept>
#include <string>

#include "data/augment/policies.h"

namespace trainer {

const char* to_string(AugmentPolicy policy) {
  switch (policy) {
    case AugmentPolicy::randaugment:
      return "randaugment";
    case AugmentPolicy::trivialaugment:
      return "trivialaugment";
    case AugmentPolicy::autoaugment:
      return "autoaugment";
    case AugmentPolicy::none:
      break;
  }
  return "none";
}

void check_augment_config(const AugmentConfig& config) {
  const auto fail = [](const std::string& what) { throw std::invalid_argument("augmentation: " + what); };
  if (config.magnitude_bins < 2) fail("magnitude_bins must be >= 2");
  if (config.randaugment_ops < 0) fail("randaugment_ops must be >= 0");
  if (config.randaugment_magnitude < 0 || config.randaugment_magnitude >= config.magnitude_bins)
    fail("randaugment_magnitude must be in [0, magnitude_bins)");
  const ColorJitterConfig& jitter = config.color_jitter;
  if (jitter.brightness < 0 || jitter.contrast < 0 || jitter.saturation < 0 || jitter.hue < 0 ||
      jitter.hue > 0.5)
    fail("color_jitter strengths must be >= 0, hue <= 0.5");
  const RandomErasingConfig& erasing = config.erasing;
  if (erasing.probability < 0 || erasing.probability > 1) fail("erasing probability must be in [0, 1]");
  if (!(erasing.scale_min > 0 && erasing.scale_min <= erasing.scale_max && erasing.scale_max <= 1))
    fail("erasing scale must satisfy 0 < min <= max <= 1");
  if (!(erasing.ratio_min > 0 && erasing.ratio_min <= erasing.ratio_max))
    fail("erasing ratio must satisfy 0 < min <= max");
}

void apply_augment(const AugmentConfig& config, uint8_t* hwc, ImageSize size, Generator& gen,
                   std::vector<uint8_t>& scratch) {
  switch (config.policy) {
    case AugmentPolicy::randaugment:
      rand_augment(config.randaugment_ops, config.randaugment_magnitude, config.magnitude_bins, hwc, size,
                   gen, scratch);
      break;
    case AugmentPolicy::trivialaugment:
      trivial_augment_wide(config.magnitude_bins, hwc, size, gen, scratch);
      break;
    case AugmentPolicy::autoaugment:
      auto_augment_imagenet(hwc, size, gen, scratch);
      break;
    case AugmentPolicy::none:
      break;
  }
  if (config.color_jitter.enabled()) color_jitter(config.color_jitter, hwc, size, gen);
  if (config.erasing.enabled()) random_erasing(config.erasing, hwc, size, gen);
}

}  // namespace trainer
