#include "data/resized_crop.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <stdexcept>
#include <string>

namespace trainer {

namespace {

// Python's round(): halves go to the even neighbour. nearbyint does that in the default rounding mode.
int64_t python_round(double value) { return static_cast<int64_t>(std::nearbyint(value)); }

}  // namespace

CropBox random_resized_crop_box(int64_t height, int64_t width, const RandomResizedCropConfig& config,
                                Generator& gen, bool* fell_back) {
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_ratio_min = std::log(config.ratio_min), log_ratio_max = std::log(config.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * gen.uniform(config.scale_min, config.scale_max);
    const double aspect_ratio = std::exp(gen.uniform(log_ratio_min, log_ratio_max));
    const int64_t w = python_round(std::sqrt(target_area * aspect_ratio));
    const int64_t h = python_round(std::sqrt(target_area / aspect_ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int64_t top = static_cast<int64_t>(gen.below(static_cast<uint64_t>(height - h + 1)));
      const int64_t left = static_cast<int64_t>(gen.below(static_cast<uint64_t>(width - w + 1)));
      if (fell_back) *fell_back = false;
      return {top, left, h, w};
    }
  }
  // Fallback to a central crop.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  const double min_ratio = std::min(config.ratio_min, config.ratio_max);
  const double max_ratio = std::max(config.ratio_min, config.ratio_max);
  int64_t w = width, h = height;
  if (in_ratio < min_ratio) {
    h = python_round(static_cast<double>(w) / min_ratio);
  } else if (in_ratio > max_ratio) {
    w = python_round(static_cast<double>(h) * max_ratio);
  }
  if (fell_back) *fell_back = true;
  return {(height - h) / 2, (width - w) / 2, h, w};
}

int64_t eval_resize_size(int64_t crop_size) { return crop_size * 256 / 224; }

void resized_shorter_side(int64_t height, int64_t width, int64_t shorter, int64_t& out_height,
                          int64_t& out_width) {
  // torchvision's _compute_resized_output_size: int(new_short * long / short).
  const bool width_is_short = width <= height;
  const int64_t short_side = width_is_short ? width : height;
  const int64_t long_side = width_is_short ? height : width;
  const int64_t new_long = static_cast<int64_t>(
      static_cast<double>(shorter) * static_cast<double>(long_side) / static_cast<double>(short_side));
  out_width = width_is_short ? shorter : new_long;
  out_height = width_is_short ? new_long : shorter;
}

CropBox center_crop_box(int64_t height, int64_t width, int64_t size) {
  // torchvision: int(round((image_height - crop_height) / 2.0)).
  return {python_round(static_cast<double>(height - size) / 2.0),
          python_round(static_cast<double>(width - size) / 2.0), size, size};
}

CropBox scale_box(const CropBox& box, int64_t height, int64_t width, int64_t height2, int64_t width2) {
  if (height2 == height && width2 == width) return box;
  const double sy = static_cast<double>(height2) / static_cast<double>(height);
  const double sx = static_cast<double>(width2) / static_cast<double>(width);
  const auto edge = [](double value, int64_t lo, int64_t hi) {
    return std::clamp<int64_t>(std::llround(value), lo, hi);
  };
  const int64_t top = edge(static_cast<double>(box.top) * sy, 0, height2 - 1);
  const int64_t bottom = edge(static_cast<double>(box.top + box.height) * sy, top + 1, height2);
  const int64_t left = edge(static_cast<double>(box.left) * sx, 0, width2 - 1);
  const int64_t right = edge(static_cast<double>(box.left + box.width) * sx, left + 1, width2);
  return {top, left, bottom - top, right - left};
}

void resize_region(const uint8_t* src, int64_t height, int64_t width, int64_t channels, const CropBox& box,
                   uint8_t* dst, int64_t out_height, int64_t out_width) {
  if (box.top < 0 || box.left < 0 || box.height < 1 || box.width < 1 || box.top + box.height > height ||
      box.left + box.width > width) {
    throw std::invalid_argument("resize_region: box " + std::to_string(box.height) + "x" +
                                std::to_string(box.width) + "+" + std::to_string(box.top) + "+" +
                                std::to_string(box.left) + " outside the " + std::to_string(height) + "x" +
                                std::to_string(width) + " image");
  }
  // The loader's worker threads are the parallelism; OpenCV's own threads would oversubscribe them.
  static std::once_flag single_threaded;
  std::call_once(single_threaded, [] { cv::setNumThreads(0); });

  const int type = CV_8UC(static_cast<int>(channels));
  const cv::Mat image(static_cast<int>(height), static_cast<int>(width), type, const_cast<uint8_t*>(src));
  const cv::Mat region = image(cv::Rect(static_cast<int>(box.left), static_cast<int>(box.top),
                                        static_cast<int>(box.width), static_cast<int>(box.height)));
  cv::Mat out(static_cast<int>(out_height), static_cast<int>(out_width), type, dst);
  if (box.height == out_height && box.width == out_width) {
    region.copyTo(out);
    return;
  }
  const bool shrinking = out_height <= box.height && out_width <= box.width;
  // Up to 2x smaller on both axes, bilinear interpolation already weighs every source pixel (at exactly
  // 2x it is area averaging), and OpenCV's area path for non-integer ratios costs 5-7x more: it was
  // half of a training sample's time after DCT-scaled region decoding, which leaves most crops 1-1.5x
  // the output (jpeg_crop_bench). Pixels move by 1.5 levels on average (resized_crop_test bounds it).
  const bool within_2x = box.height <= 2 * out_height && box.width <= 2 * out_width;
  cv::resize(region, out, out.size(), 0, 0, shrinking && !within_2x ? cv::INTER_AREA : cv::INTER_LINEAR);
}

}  // namespace trainer
