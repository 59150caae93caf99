#pragma once
// The geometric transforms of image-folder datasets, which turn images of any size into the fixed
// image_size x image_size that batches need (torchvision's ImageNet recipe):
//   training:   RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)): a random region of
//               random area and aspect ratio, resized to size x size;
//   evaluation: Resize(size * 256 / 224) of the shorter side, then CenterCrop(size).
// The crop geometry follows torchvision's code exactly (Python's round-half-to-even included); the
// pixels are resized with OpenCV: area averaging when shrinking more than 2x (close to PIL's
// antialiased bilinear, which torchvision uses), bilinear otherwise (at most 2x smaller it reads every
// source pixel too, at a fifth of the cost).
#include <cstdint>

#include "nn/random.h"

namespace trainer {

// A region of an image, in pixels.
struct CropBox {
  int64_t top = 0;
  int64_t left = 0;
  int64_t height = 0;
  int64_t width = 0;
  bool operator==(const CropBox&) const = default;
};

struct RandomResizedCropConfig {
  double scale_min = 0.08;  // range of the region's area as a fraction of the image's
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;  // range of the region's width / height (drawn log-uniformly)
  double ratio_max = 4.0 / 3.0;
};

// torchvision.transforms.RandomResizedCrop.get_params: up to 10 attempts at a region of random area
// and aspect ratio that fits inside the image, at a uniform position; when all fail, the largest
// centred region whose aspect ratio is clamped into the range. *fell_back tells which happened.
CropBox random_resized_crop_box(int64_t height, int64_t width, const RandomResizedCropConfig& config,
                                Generator& gen, bool* fell_back = nullptr);

// The evaluation resize length for a crop size: size * 256 / 224 (256 for 224), rounded down.
int64_t eval_resize_size(int64_t crop_size);

// torchvision Resize(shorter): the image's size with its shorter side scaled to `shorter` and the
// longer side scaled by the same factor, truncated.
void resized_shorter_side(int64_t height, int64_t width, int64_t shorter, int64_t& out_height,
                          int64_t& out_width);

// torchvision CenterCrop(size) of a height x width image (which must be at least size x size).
CropBox center_crop_box(int64_t height, int64_t width, int64_t size);

// Maps a region of a height x width image onto the same image at height2 x width2 (decoded at a DCT
// scale, or kept downscaled in data.cache = "decoded"): edges scaled and rounded to whole pixels, at
// least one pixel each way.
CropBox scale_box(const CropBox& box, int64_t height, int64_t width, int64_t height2, int64_t width2);

// Resizes region `box` of src ([height, width, channels]) to dst ([out_height, out_width, channels]).
void resize_region(const uint8_t* src, int64_t height, int64_t width, int64_t channels, const CropBox& box,
                   uint8_t* dst, int64_t out_height, int64_t out_width);

}  // namespace trainer
