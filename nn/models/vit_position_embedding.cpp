#include "nn/models/vit_position_embedding.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer {
namespace {

constexpr double kCubicA = -0.75;  // PyTorch's bicubic coefficient (OpenCV's too)

// Keys' cubic convolution kernel at distance |x| <= 1 and 1 < |x| < 2.
double cubic_near(double x) { return ((kCubicA + 2.0) * x - (kCubicA + 3.0)) * x * x + 1.0; }
double cubic_far(double x) { return ((kCubicA * x - 5.0 * kCubicA) * x + 8.0 * kCubicA) * x - 4.0 * kCubicA; }

// Where output position o of `out` samples reads an axis of `in` (align_corners=True): the four
// input indices, clamped to the axis, and their weights.
struct CubicTaps {
  std::array<int64_t, 4> index;
  std::array<double, 4> weight;
};

CubicTaps cubic_taps(int64_t o, int64_t in, int64_t out) {
  const double scale = out > 1 ? static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0;
  const double src = scale * static_cast<double>(o);
  const int64_t base = static_cast<int64_t>(std::floor(src));
  const double t = src - static_cast<double>(base);
  CubicTaps taps;
  taps.weight = {cubic_far(t + 1.0), cubic_near(t), cubic_near(1.0 - t), cubic_far(2.0 - t)};
  for (int i = 0; i < 4; ++i) taps.index[i] = std::clamp<int64_t>(base - 1 + i, 0, in - 1);
  return taps;
}

}  // namespace

Tensor interpolate_position_embedding(const Tensor& pos, int64_t new_grid) {
  const int64_t tokens = pos.dim() == 3 ? pos.size(1) : 0;
  const auto grid =
      static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(std::max<int64_t>(tokens - 1, 0)))));
  if (pos.dim() != 3 || pos.size(0) != 1 || tokens < 2 || grid * grid != tokens - 1 || new_grid < 1)
    throw std::invalid_argument(
        "interpolate_position_embedding: expects [1, 1 + g*g, D] and a new grid >= 1, got " +
        shape_str(pos.shape()) + " and " + std::to_string(new_grid));
  const int64_t d = pos.size(2);
  const Tensor host = pos.to(Device::cpu());
  if (new_grid == grid) return host.clone();
  const std::vector<double> in = host.to(DType::f64).contiguous().to_vector<double>();  // [1 + g*g, D]
  std::vector<double> out(static_cast<size_t>((1 + new_grid * new_grid) * d));
  std::copy(in.begin(), in.begin() + d, out.begin());  // the class token
  auto at = [&](int64_t y, int64_t x, int64_t c) {
    return in[static_cast<size_t>((1 + y * grid + x) * d + c)];
  };
  for (int64_t oy = 0; oy < new_grid; ++oy) {
    const CubicTaps ty = cubic_taps(oy, grid, new_grid);
    for (int64_t ox = 0; ox < new_grid; ++ox) {
      const CubicTaps tx = cubic_taps(ox, grid, new_grid);
      for (int64_t c = 0; c < d; ++c) {
        // Along x in each of the four rows, then along y, in PyTorch's order.
        double v = 0.0;
        for (int i = 0; i < 4; ++i) {
          double row = 0.0;
          for (int j = 0; j < 4; ++j) row += tx.weight[j] * at(ty.index[i], tx.index[j], c);
          v += ty.weight[i] * row;
        }
        out[static_cast<size_t>((1 + oy * new_grid + ox) * d + c)] = v;
      }
    }
  }
  return Tensor::from_vector(out, {1, 1 + new_grid * new_grid, d}).to(pos.dtype());
}

}  // namespace trainer
