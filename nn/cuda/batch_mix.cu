// Mixup and CutMix of a batch with its reverse on the GPU (timm's mode "batch"), with the formulas of
// nn/batch_mix_math.h. The draws are read from the device, never passed as launch arguments, so a
// CUDA graph that captured these kernels mixes each replay with the draws staged before it.
#include "nn/batch_mix_math.h"
#include "nn/cuda/kernels.cuh"
#include "nn/soft_target_checks.h"

namespace trainer {

Tensor CudaBackend::mix_images(const Tensor& images, const Tensor& draws) {
  using namespace cuda;
  check_device(images, "mix_images", "images");
  check_mix_images(images, draws, "mix_images");
  const MemoryFormat format = images.suggest_memory_format();
  Tensor out = empty(images.shape(), images.dtype(), format);
  const int64_t N = images.size(0), C = images.size(1), H = images.size(2), W = images.size(3);
  const Shape& si = images.strides();
  const Shape& so = out.strides();
  const int64_t i0 = si[0], i1 = si[1], i2 = si[2], i3 = si[3];
  const int64_t o0 = so[0], o1 = so[1], o2 = so[2], o3 = so[3];
  const double* pd = static_cast<const double*>(draws.raw_data());
  CUDA_DISPATCH_FLOAT(images.dtype(), "mix_images", [&] {
    using acc = acc_t<scalar_t>;
    const scalar_t* px = static_cast<const scalar_t*>(images.raw_data());
    scalar_t* po = static_cast<scalar_t*>(out.raw_data());
    // i walks the logical [N, C, H, W] order; each side is addressed through its own strides.
    for_each(N * C * H * W, [=] __device__(int64_t i) {
      const int64_t x = i % W, y = (i / W) % H, c = (i / (W * H)) % C, n = i / (W * H * C);
      const int64_t at = c * i1 + y * i2 + x * i3;
      const acc own = to_acc(px[n * i0 + at]), partner = to_acc(px[mix_partner(n, N) * i0 + at]);
      po[n * o0 + c * o1 + y * o2 + x * o3] = store<scalar_t>(mixed_pixel<acc>(pd, y, x, own, partner));
    });
  });
  return out;
}

Tensor CudaBackend::mix_targets(const Tensor& labels_in, int64_t classes, double label_smoothing,
                                const Tensor& draws, DType dtype) {
  using namespace cuda;
  check_device(labels_in, "mix_targets", "labels");
  check_mix_targets(labels_in, classes, label_smoothing, draws, dtype, "mix_targets");
  const Tensor labels = labels_in.contiguous();
  const int64_t N = labels.size(0);
  const double off = label_smoothing / static_cast<double>(classes), on = 1.0 - label_smoothing + off;
  Tensor out = empty({N, classes}, dtype);
  const double* pd = static_cast<const double*>(draws.raw_data());
  const int64_t* pl = static_cast<const int64_t*>(labels.raw_data());
  CUDA_DISPATCH_FLOAT(dtype, "mix_targets", [&] {
    scalar_t* po = static_cast<scalar_t*>(out.raw_data());
    // An out-of-range label matches no class: its row holds only the smoothing (the loss stays finite
    // and wrong; a host check here would stall the stream).
    for_each(N * classes, [=] __device__(int64_t i) {
      const int64_t row = i / classes, k = i - row * classes;
      po[i] = from_acc<scalar_t>(mixed_target(pd, k, pl[row], pl[mix_partner(row, N)], on, off));
    });
  });
  return out;
}

}  // namespace trainer
