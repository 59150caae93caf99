// RandomResizedCrop to 224x224 of JPEGs, one thread: the whole image decoded at the crop's DCT scale
// (decode_image, the path before data/jpeg_region) against only the crop's rows and columns
// (decode_jpeg_region, ImageFolder's training path). Same crops, same outputs; images per second.
//   build/jpeg_crop_bench [--images N] [--width W] [--height H] [--quality Q] [--rounds R]
// The default images are the size and quality of the folder in issue 24 (500x375, quality 90, 4:2:0).
#include <turbojpeg.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "data/image_codec.h"
#include "data/jpeg_region.h"
#include "data/resized_crop.h"
#include "nn/random.h"

namespace {

using namespace trainer;

std::vector<uint8_t> photo_like(int width, int height, Generator& gen) {
  // Smooth gradients plus noise: compresses like a photograph (about 2 bits per pixel at quality 90).
  std::vector<uint8_t> hwc(static_cast<size_t>(width) * height * 3);
  const double fx = 0.01 + 0.05 * gen.uniform(), fy = 0.01 + 0.05 * gen.uniform();
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) {
        const double v = 128 + 70 * std::sin(fx * x * (c + 1) + fy * y) + 30 * (gen.uniform() - 0.5);
        hwc[(static_cast<size_t>(y) * width + x) * 3 + c] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
  return hwc;
}

std::vector<uint8_t> encode_420(const std::vector<uint8_t>& hwc, int width, int height, int quality) {
  tjhandle tj = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  if (tjCompress2(tj, hwc.data(), width, 0, height, TJPF_RGB, &jpeg, &size, TJSAMP_420, quality, 0) != 0) {
    std::fprintf(stderr, "jpeg_crop_bench: encoding failed: %s\n", tjGetErrorStr2(tj));
    std::exit(1);
  }
  std::vector<uint8_t> out(jpeg, jpeg + size);
  tjFree(jpeg);
  tjDestroy(tj);
  return out;
}

CropBox scaled_box(const CropBox& box, int64_t height, int64_t width, int64_t h2, int64_t w2) {
  const double sy = static_cast<double>(h2) / static_cast<double>(height);
  const double sx = static_cast<double>(w2) / static_cast<double>(width);
  const int64_t top = std::clamp<int64_t>(std::llround(box.top * sy), 0, h2 - 1);
  const int64_t left = std::clamp<int64_t>(std::llround(box.left * sx), 0, w2 - 1);
  return {top, left, std::clamp<int64_t>(std::llround((box.top + box.height) * sy), top + 1, h2) - top,
          std::clamp<int64_t>(std::llround((box.left + box.width) * sx), left + 1, w2) - left};
}

}  // namespace

int main(int argc, char** argv) {
  int images = 64, width = 500, height = 375, quality = 90, rounds = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--images")
      images = value;
    else if (flag == "--width")
      width = value;
    else if (flag == "--height")
      height = value;
    else if (flag == "--quality")
      quality = value;
    else if (flag == "--rounds")
      rounds = value;
    else {
      std::fprintf(stderr, "jpeg_crop_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  Generator gen(1);
  std::vector<std::vector<uint8_t>> files;
  size_t bytes = 0;
  for (int i = 0; i < images; ++i) {
    files.push_back(encode_420(photo_like(width, height, gen), width, height, quality));
    bytes += files.back().size();
  }
  constexpr int64_t kOut = 224;
  std::vector<uint8_t> out(kOut * kOut * 3), reference(kOut * kOut * 3);
  DecodedImage whole;
  JpegRegion region;
  double seconds[2] = {0, 0};
  int64_t mismatches = 0;
  for (int round = 0; round < rounds; ++round) {
    for (int path = 0; path < 2; ++path) {
      Generator crops(100 + round);  // the same crops for both paths
      const auto start = std::chrono::steady_clock::now();
      for (const auto& file : files) {
        const CropBox box = random_resized_crop_box(height, width, RandomResizedCropConfig{}, crops);
        const double min_scale =
            std::max(static_cast<double>(kOut) / box.width, static_cast<double>(kOut) / box.height);
        if (path == 0) {
          decode_image(file.data(), file.size(), 3, whole, min_scale);
          resize_region(whole.pixels.data(), whole.height, whole.width, 3,
                        scaled_box(box, height, width, whole.height, whole.width), reference.data(), kOut,
                        kOut);
        } else {
          decode_jpeg_region(file.data(), file.size(), 3, box, min_scale, region);
          resize_region(region.image.pixels.data(), region.image.height, region.image.width, 3, region.crop,
                        out.data(), kOut, kOut);
        }
      }
      seconds[path] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    // The last crop of each round compared (both paths left their output of it behind).
    mismatches += std::memcmp(out.data(), reference.data(), out.size()) != 0;
  }
  const double n = static_cast<double>(images) * rounds;
  std::printf("%d JPEGs %dx%d quality %d 4:2:0 (%.0f KB on average), RandomResizedCrop to 224, one thread\n",
              images, width, height, quality, bytes / 1024.0 / images);
  std::printf("  whole image decoded:   %7.1f images/s\n", n / seconds[0]);
  std::printf("  crop region decoded:   %7.1f images/s  (%.2fx)\n", n / seconds[1], seconds[0] / seconds[1]);
  std::printf("  outputs differing: %lld of %d compared\n", static_cast<long long>(mismatches), rounds);
  return mismatches == 0 ? 0 : 1;
}
