#pragma once
// Argument checks of the soft-target losses and the batch-mixing kernels, shared by the CPU and CUDA
// backends so both reject the same inputs with the same messages.
#include <cstdint>

#include "nn/tensor.h"

namespace trainer {

// logits [N, K] and targets [N, K], both floating. Returns K.
int64_t check_soft_targets(const Tensor& logits, const Tensor& targets, const char* op);
// A loss backward's per-sample weights: [n].
void check_loss_weights(const Tensor& grad_loss, int64_t n, const char* op);
// The draws: f64 [kMixDrawValues] on `device` (nn/batch_mix_math.h).
void check_mix_draws(const Tensor& draws, Device device, const char* op);
// images: floating [N, C, H, W]; draws as above, on the images' device.
void check_mix_images(const Tensor& images, const Tensor& draws, const char* op);
// labels i64 [N], classes >= 1, label smoothing in [0, 1), a floating dtype; draws as above.
void check_mix_targets(const Tensor& labels, int64_t classes, double label_smoothing, const Tensor& draws,
                       DType dtype, const char* op);

}  // namespace trainer
