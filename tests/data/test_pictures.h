#pragma once
// Pictures for the JPEG tests: smooth with some texture, so every DCT block has detail, as a
// photograph's would; and their 4:2:0 JPEGs, as most cameras and web images are (encode_jpeg writes
// 4:4:4).
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace trainer::testing {

inline std::vector<uint8_t> picture(int width, int height) {
  std::vector<uint8_t> hwc(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c)
        hwc[(static_cast<size_t>(y) * width + x) * 3 + c] = static_cast<uint8_t>(
            127 + 60 * std::sin(0.05 * x * (c + 1) + 0.03 * y) +
            40 * std::cos(0.11 * y * (3 - c) - 0.07 * x) + ((x * 7 + y * 13 + c * 5) % 17));
  return hwc;
}

inline std::vector<uint8_t> encode_420(const std::vector<uint8_t>& hwc, int width, int height) {
  tjhandle tj = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, hwc.data(), width, 0, height, TJPF_RGB, &jpeg, &size, TJSAMP_420, 90, 0), 0);
  std::vector<uint8_t> out(jpeg, jpeg + size);
  tjFree(jpeg);
  tjDestroy(tj);
  return out;
}

}  // namespace trainer::testing
