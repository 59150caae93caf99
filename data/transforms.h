#pragma once
// Training augmentations on one uint8 image in HWC layout, in place. All randomness comes from the
// Generator passed in; the loader gives each sample its own, derived from (seed, epoch, index), so
// the result does not depend on which thread runs it.
#include <cstdint>
#include <vector>

#include "data/augment/augment.h"
#include "data/image_size.h"
#include "nn/random.h"

namespace trainer {

struct TransformConfig {
  // torchvision RandomCrop(size=(H, W), padding=crop_padding): pad with zeros on every side, then cut
  // an H x W window at a random offset. 0 disables it.
  int64_t crop_padding = 0;
  bool horizontal_flip = false;  // RandomHorizontalFlip(p=0.5)
  // After the crop and the flip: a policy (RandAugment...), colour jitter, random erasing (data/augment/).
  AugmentConfig augment;
  bool enabled() const { return crop_padding > 0 || horizontal_flip || augment.enabled(); }
};

// dst(y, x) = src(y + dy, x + dx), zero where that falls outside src. dst and src must not overlap.
void shift_with_zero_fill(const uint8_t* src, uint8_t* dst, ImageSize size, int64_t dy, int64_t dx);

// Same image size out as in; the window's top-left corner in the padded image is drawn uniformly from
// [0, 2 * padding]^2, top first, like torchvision. scratch is resized and reused across calls.
void random_crop(uint8_t* hwc, ImageSize size, int64_t padding, Generator& gen,
                 std::vector<uint8_t>& scratch);

void horizontal_flip(uint8_t* hwc, ImageSize size);
// Flips with probability 1/2; always draws one number, so later draws do not depend on the outcome.
void random_horizontal_flip(uint8_t* hwc, ImageSize size, Generator& gen);

// Crop, then flip, then the augmentations: torchvision's usual order (RandomCrop or RandomResizedCrop,
// RandomHorizontalFlip, AutoAugment/RandAugment/TrivialAugmentWide, ..., RandomErasing).
void apply_transforms(const TransformConfig& config, uint8_t* hwc, ImageSize size, Generator& gen,
                      std::vector<uint8_t>& scratch);

}  // namespace trainer
