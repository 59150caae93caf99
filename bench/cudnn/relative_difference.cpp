#include "bench/cudnn/relative_difference.h"

#include <algorithm>
#include <cmath>

namespace trainer::bench {

double relative_difference(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu()).to(DType::f32).contiguous(),
               hb = b.to(Device::cpu()).to(DType::f32).contiguous();
  const float* pa = ha.data<float>();
  const float* pb = hb.data<float>();
  double diff = 0.0, scale = 0.0;
  for (int64_t i = 0; i < ha.numel(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(pa[i] - pb[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(pb[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace trainer::bench
