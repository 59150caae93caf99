#pragma once
// The shape of one uint8 image in HWC layout, as the loader's transforms and augmentations see it.
#include <cstdint>

namespace trainer {

struct ImageSize {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;
  int64_t bytes() const { return height * width * channels; }
  int64_t pixels() const { return height * width; }
};

}  // namespace trainer
