#include "app/run/augmentation.h"

namespace trainer {

AugmentConfig train_augmentation(const Config& config) {
  const AugmentSection& a = config.augment;
  AugmentConfig out;
  out.policy = a.policy;
  out.randaugment_ops = a.randaugment_ops;
  out.randaugment_magnitude = a.randaugment_magnitude;
  out.magnitude_bins = a.magnitude_bins;
  if (!a.color_jitter.empty())  // [] = off; load_config accepts only 0 or 4 values
    out.color_jitter = {a.color_jitter.at(0), a.color_jitter.at(1), a.color_jitter.at(2),
                        a.color_jitter.at(3)};
  out.erasing.probability = a.random_erasing;
  out.erasing.scale_min = a.erasing_scale.at(0);
  out.erasing.scale_max = a.erasing_scale.at(1);
  out.erasing.ratio_min = a.erasing_ratio.at(0);
  out.erasing.ratio_max = a.erasing_ratio.at(1);
  out.erasing.value = a.erasing_value;
  check_augment_config(out);  // load_config has reported these against the keys already
  return out;
}

}  // namespace trainer
