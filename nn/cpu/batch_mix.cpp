// Mixup and CutMix of a batch with its reverse on the CPU (timm's mode "batch"), with the formulas of
// nn/batch_mix_math.h. The images keep their layout (a channels-last batch stays channels-last).
#include <vector>

#include "nn/batch_mix_math.h"
#include "nn/cpu/cpu_backend.h"
#include "nn/kernel_checks.h"
#include "nn/soft_target_checks.h"

namespace trainer {

Tensor CpuBackend::mix_images(const Tensor& images, const Tensor& draws_in) {
  check_mix_images(images, draws_in, "mix_images");
  const std::vector<double> draws = draws_in.to_vector<double>();
  Tensor out = Tensor::empty(images.shape(), images.dtype(), images.device(), images.suggest_memory_format());
  const int64_t N = images.size(0), C = images.size(1), H = images.size(2), W = images.size(3);
  const auto& si = images.strides();
  const auto& so = out.strides();
  TRAINER_DISPATCH_FLOAT(images.dtype(), "mix_images", [&] {
    const scalar_t* px = images.data<scalar_t>();
    scalar_t* po = out.data<scalar_t>();
    for (int64_t n = 0; n < N; ++n) {
      const int64_t partner = mix_partner(n, N);
      for (int64_t c = 0; c < C; ++c)
        for (int64_t y = 0; y < H; ++y)
          for (int64_t x = 0; x < W; ++x) {
            const int64_t at = c * si[1] + y * si[2] + x * si[3];
            po[n * so[0] + c * so[1] + y * so[2] + x * so[3]] =
                mixed_pixel<scalar_t>(draws.data(), y, x, px[n * si[0] + at], px[partner * si[0] + at]);
          }
    }
  });
  return out;
}

Tensor CpuBackend::mix_targets(const Tensor& labels_in, int64_t classes, double label_smoothing,
                               const Tensor& draws_in, DType dtype) {
  check_mix_targets(labels_in, classes, label_smoothing, draws_in, dtype, "mix_targets");
  const Tensor labels = host_targets_in_range(labels_in, labels_in.size(0), classes, "mix_targets");
  const std::vector<double> draws = draws_in.to_vector<double>();
  const int64_t N = labels.size(0);
  const double off = label_smoothing / static_cast<double>(classes), on = 1.0 - label_smoothing + off;
  Tensor out = Tensor::empty({N, classes}, dtype);
  const int64_t* pl = labels.data<int64_t>();
  TRAINER_DISPATCH_FLOAT(dtype, "mix_targets", [&] {
    scalar_t* po = out.data<scalar_t>();
    for (int64_t i = 0; i < N; ++i)
      for (int64_t k = 0; k < classes; ++k)
        po[i * classes + k] =
            static_cast<scalar_t>(mixed_target(draws.data(), k, pl[i], pl[mix_partner(i, N)], on, off));
  });
  return out;
}

}  // namespace trainer
