#pragma once
// The automatic augmentation policies of torchvision (0.14) on one uint8 HWC image, in place:
//   AutoAugment(ImageNet policy)  one of 25 learned pairs of (op, probability, magnitude bin);
//   RandAugment(n, m, bins)       n ops drawn uniformly from 14, each at magnitude bin m;
//   TrivialAugmentWide(bins)      one op drawn uniformly from 14, at a uniformly drawn bin.
// The op lists and magnitude tables are torchvision's _augmentation_space, entry by entry in float32
// (torch.linspace's arithmetic), with the same signs (a coin flip per signed op) and fill 0;
// scripts/torchvision_augment_parity.py checks both against torchvision. Every random draw comes from
// the Generator passed in, a fixed number per call, so a sample's result depends only on its seed.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "data/image_size.h"
#include "nn/random.h"

namespace trainer {

enum class AugmentOp {
  identity,
  shear_x,
  shear_y,
  translate_x,
  translate_y,
  rotate,
  brightness,
  color,
  contrast,
  sharpness,
  posterize,
  solarize,
  autocontrast,
  equalize,
  invert,
};

// torchvision's name of the op: "Identity", "ShearX", ...
const char* op_name(AugmentOp op);

// One entry of an augmentation space: the op, its magnitude per bin (empty for an op without one,
// torchvision's torch.tensor(0.0)), and whether a coin flip negates the magnitude.
struct OpSpace {
  AugmentOp op;
  std::vector<float> magnitudes;
  bool is_signed = false;
};

// torch.linspace(start, end, steps)[index] in float32, as PyTorch's CPU kernel (1.13, AVX2) computes it:
// from the start for the first half, from the end for the second, vectorised 8 at a time. Another
// kernel (AVX-512, or none) may round a value differently in its last bit.
float torch_linspace(float start, float end, int64_t steps, int64_t index);

// RandAugment._augmentation_space(bins, (height, width)), in its order (the op drawn is an index).
std::vector<OpSpace> randaugment_space(int bins, int64_t height, int64_t width);
// TrivialAugmentWide._augmentation_space(bins).
std::vector<OpSpace> trivial_augment_wide_space(int bins);
// AutoAugment._augmentation_space(10, (height, width)): RandAugment's ops at 10 bins, no Identity,
// plus Invert.
std::vector<OpSpace> autoaugment_space(int64_t height, int64_t width);

struct PolicyStep {
  AugmentOp op;
  double probability;
  int magnitude_bin;  // -1: the op takes no magnitude
};
// AutoAugmentPolicy.IMAGENET's 25 sub-policies, in torchvision's order.
const std::vector<std::array<PolicyStep, 2>>& autoaugment_imagenet_policy();

// autoaugment._apply_op: one op at a signed magnitude (posterize's bits and translations' pixels are
// int(magnitude)). scratch is resized and reused.
void apply_op(AugmentOp op, double magnitude, uint8_t* hwc, ImageSize size, std::vector<uint8_t>& scratch);

void rand_augment(int num_ops, int magnitude_bin, int bins, uint8_t* hwc, ImageSize size, Generator& gen,
                  std::vector<uint8_t>& scratch);
void trivial_augment_wide(int bins, uint8_t* hwc, ImageSize size, Generator& gen,
                          std::vector<uint8_t>& scratch);
void auto_augment_imagenet(uint8_t* hwc, ImageSize size, Generator& gen, std::vector<uint8_t>& scratch);

}  // namespace trainer
