#pragma once
// The colour ops of AutoAugment, RandAugment, TrivialAugmentWide and ColorJitter on one uint8 HWC image
// (1 or 3 channels), in place, with torchvision.transforms.functional's tensor semantics (0.14) in its
// own float32 arithmetic, so results match it bit for bit: a blend is ratio * a + (1 - ratio) * b in
// float32, clamped to [0, 255] and truncated; grey is 0.2989 R + 0.587 G + 0.114 B truncated.
#include <array>
#include <cstdint>
#include <vector>

#include "data/image_size.h"
#include "nn/random.h"

namespace trainer {

void adjust_brightness(uint8_t* hwc, ImageSize size, double factor);
// Saturation ("Color" in the policies): a blend with the grey image; no-op on 1 channel.
void adjust_saturation(uint8_t* hwc, ImageSize size, double factor);
// A blend with the mean of the grey image (float32).
void adjust_contrast(uint8_t* hwc, ImageSize size, double factor);
// A blend with the image smoothed by [[1,1,1],[1,5,1],[1,1,1]] / 13 (rounded to bytes), the border
// rows and columns kept as they are. scratch is resized and reused.
void adjust_sharpness(uint8_t* hwc, ImageSize size, double factor, std::vector<uint8_t>& scratch);
// Rotates the hue by factor (in [-0.5, 0.5]) of a turn through HSV in float32; no-op on 1 channel.
void adjust_hue(uint8_t* hwc, ImageSize size, double factor);

// torchvision's ColorJitter(brightness, contrast, saturation, hue): factors drawn uniformly from
// [max(0, 1 - b), 1 + b] (the same for c and s) and [-h, h], applied in a random order; a zero
// strength leaves its op out.
struct ColorJitterConfig {
  double brightness = 0, contrast = 0, saturation = 0, hue = 0;
  bool enabled() const { return brightness > 0 || contrast > 0 || saturation > 0 || hue > 0; }
  bool operator==(const ColorJitterConfig&) const = default;
};

// Draws a permutation of the four ops (Fisher-Yates, 3 draws), then the four factors (always, so the
// number of draws does not depend on the strengths), then applies the enabled ops in that order.
void color_jitter(const ColorJitterConfig& config, uint8_t* hwc, ImageSize size, Generator& gen);

}  // namespace trainer
