#include "data/augment/geometric.h"

#include <cmath>
#include <cstring>
#include <numbers>

namespace trainer {

namespace {

double radians(double degrees) { return degrees * std::numbers::pi / 180.0; }

double degrees(double radians) { return radians * 180.0 / std::numbers::pi; }

// nearbyint (halves to even, as grid_sample's nearest rounds) without a library call: adding and
// subtracting 1.5 * 2^23 leaves the float rounded to an integer in the default rounding mode, exact
// for |x| < 2^22, far beyond any image's coordinates; larger values are outside the image anyway.
float round_half_even(float x) {
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  if (!(std::fabs(x) < 4194304.0f)) return x;
  return (x + kShift) - kShift;  // not folded: the build keeps IEEE semantics (no -ffast-math)
}

}  // namespace

std::array<double, 6> inverse_affine_matrix(double center_x, double center_y, double angle_degrees,
                                            double translate_x, double translate_y, double shear_x_degrees,
                                            double shear_y_degrees) {
  // The forward map is T * C * R(angle) * ShearY * ShearX * C^-1; its rotation-shear part has
  // determinant 1, so its inverse is the adjugate.
  const double rot = radians(angle_degrees), sx = radians(shear_x_degrees), sy = radians(shear_y_degrees);
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  std::array<double, 6> m = {d, -b, 0.0, -c, a, 0.0};
  m[2] += m[0] * (-center_x - translate_x) + m[1] * (-center_y - translate_y);
  m[5] += m[3] * (-center_x - translate_x) + m[4] * (-center_y - translate_y);
  m[2] += center_x;
  m[5] += center_y;
  return m;
}

void warp_affine_nearest(uint8_t* hwc, ImageSize size, const std::array<double, 6>& inverse,
                         std::vector<uint8_t>& scratch) {
  scratch.assign(hwc, hwc + size.bytes());
  const int64_t h = size.height, w = size.width, c = size.channels;
  // torchvision's _gen_affine_grid + grid_sample, in its float32 arithmetic: the matrix divided by half
  // the size (normalised coordinates), applied to the pixel centres, then unnormalised and rounded.
  const float half_w = 0.5f * static_cast<float>(w), half_h = 0.5f * static_cast<float>(h);
  float m[6];
  for (int i = 0; i < 6; ++i) m[i] = static_cast<float>(inverse[static_cast<size_t>(i)]);
  const float x0 = m[0] / half_w, x1 = m[1] / half_w, x2 = m[2] / half_w;
  const float y0 = m[3] / half_h, y1 = m[4] / half_h, y2 = m[5] / half_h;
  const float fw = static_cast<float>(w), fh = static_cast<float>(h);
  for (int64_t i = 0; i < h; ++i) {
    const float yc = -half_h + 0.5f + static_cast<float>(i);
    for (int64_t j = 0; j < w; ++j) {
      const float xc = -half_w + 0.5f + static_cast<float>(j);
      const float gx = (xc * x0 + yc * x1) + x2, gy = (xc * y0 + yc * y1) + y2;
      const float sx = round_half_even(((gx + 1.0f) * fw - 1.0f) / 2.0f);
      const float sy = round_half_even(((gy + 1.0f) * fh - 1.0f) / 2.0f);
      uint8_t* out = hwc + (i * w + j) * c;
      if (sx < 0 || sy < 0 || sx >= fw || sy >= fh) {
        std::memset(out, 0, static_cast<size_t>(c));
        continue;
      }
      const uint8_t* in = scratch.data() + (static_cast<int64_t>(sy) * w + static_cast<int64_t>(sx)) * c;
      for (int64_t k = 0; k < c; ++k) out[k] = in[k];
    }
  }
}

void shear_x(uint8_t* hwc, ImageSize size, double magnitude, std::vector<uint8_t>& scratch) {
  // torchvision passes center=[0, 0] (the top-left corner), i.e. -size / 2 in centred coordinates.
  const double cx = -0.5 * static_cast<double>(size.width), cy = -0.5 * static_cast<double>(size.height);
  warp_affine_nearest(hwc, size, inverse_affine_matrix(cx, cy, 0, 0, 0, degrees(std::atan(magnitude)), 0),
                      scratch);
}

void shear_y(uint8_t* hwc, ImageSize size, double magnitude, std::vector<uint8_t>& scratch) {
  const double cx = -0.5 * static_cast<double>(size.width), cy = -0.5 * static_cast<double>(size.height);
  warp_affine_nearest(hwc, size, inverse_affine_matrix(cx, cy, 0, 0, 0, 0, degrees(std::atan(magnitude))),
                      scratch);
}

void translate_x(uint8_t* hwc, ImageSize size, double magnitude, std::vector<uint8_t>& scratch) {
  const double pixels = std::trunc(magnitude);  // Python's int()
  if (pixels == 0) return;
  warp_affine_nearest(hwc, size, inverse_affine_matrix(0, 0, 0, pixels, 0, 0, 0), scratch);
}

void translate_y(uint8_t* hwc, ImageSize size, double magnitude, std::vector<uint8_t>& scratch) {
  const double pixels = std::trunc(magnitude);
  if (pixels == 0) return;
  warp_affine_nearest(hwc, size, inverse_affine_matrix(0, 0, 0, 0, pixels, 0, 0), scratch);
}

void rotate(uint8_t* hwc, ImageSize size, double degrees, std::vector<uint8_t>& scratch) {
  // F.rotate's angle is counter-clockwise; the matrix takes affine's clockwise angle.
  warp_affine_nearest(hwc, size, inverse_affine_matrix(0, 0, -degrees, 0, 0, 0, 0), scratch);
}

}  // namespace trainer
