#pragma once
// RandomErasing (Zhong et al., 2017) with the box of torchvision.transforms.RandomErasing and timm's
// RandomErasing (count 1): with probability p, up to 10 attempts at a box of area
// uniform(scale) * H * W and aspect ratio h / w = exp(uniform(log ratio)), h = round(sqrt(area * ratio)),
// w = round(sqrt(area / ratio)) (Python's round), kept when h < H and w < W, at a uniform position;
// after 10 failures the image is left alone.
//
// Where we differ, and why: both libraries erase the normalised float tensor; we erase the uint8
// image in the loader thread, before normalisation (the loader hands the model uint8 batches, and
// normalisation may run on the GPU). value "zero" writes bytes 0, i.e. -mean/std after normalisation,
// where torchvision's value=0 writes 0 after normalisation (the dataset's mean colour). value "random"
// writes uniform random bytes per pixel and channel (normalised: mean (0.5 - mean) / std, standard
// deviation 0.289 / std, about 1.3 for ImageNet's statistics), where timm's mode "pixel" and
// torchvision's value="random" draw a standard normal per element of the normalised tensor.
#include <cstdint>
#include <vector>

#include "data/image_size.h"
#include "nn/random.h"

namespace trainer {

enum class ErasingValue { zero, random };
const char* to_string(ErasingValue value);

struct RandomErasingConfig {
  double probability = 0.0;  // 0 = off
  double scale_min = 0.02, scale_max = 0.33;
  double ratio_min = 0.3, ratio_max = 3.3;
  ErasingValue value = ErasingValue::zero;
  bool enabled() const { return probability > 0; }
  bool operator==(const RandomErasingConfig&) const = default;
};

struct ErasingBox {
  int64_t top = 0, left = 0, height = 0, width = 0;  // height 0: nothing erased
  bool operator==(const ErasingBox&) const = default;
};

// The box torchvision's RandomErasing.get_params draws for an image of height x width (no probability
// draw); height 0 when every attempt failed.
ErasingBox random_erasing_box(int64_t height, int64_t width, const RandomErasingConfig& config,
                              Generator& gen);

// The whole transform: one draw against the probability, then the box, then the fill.
void random_erasing(const RandomErasingConfig& config, uint8_t* hwc, ImageSize size, Generator& gen);

}  // namespace trainer
