#pragma once
// The ops of AutoAugment, RandAugment and TrivialAugmentWide that remap each channel's levels, on one
// uint8 HWC image in place, with torchvision.transforms.functional's tensor semantics (0.14): integer
// arithmetic except autocontrast's float32 scale, so results match it bit for bit.
#include <cstdint>

#include "data/image_size.h"

namespace trainer {

// Keeps the `bits` highest bits of every byte (bits in [0, 8]).
void posterize(uint8_t* hwc, ImageSize size, int bits);
// Inverts every byte at or above threshold (a float: torchvision compares in float32).
void solarize(uint8_t* hwc, ImageSize size, double threshold);
// Stretches each channel's [min, max] to [0, 255] (a constant channel is left alone).
void autocontrast(uint8_t* hwc, ImageSize size);
// Equalizes each channel's histogram as PIL's ImageOps.equalize does (torchvision's port): the step is
// the count of all pixels but those of the highest level present, over 255.
void equalize(uint8_t* hwc, ImageSize size);
void invert(uint8_t* hwc, ImageSize size);

}  // namespace trainer
