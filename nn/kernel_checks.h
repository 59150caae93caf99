#pragma once
// Argument checks and host-side scalars that every backend's kernels share, so the CPU and CUDA
// backends reject the same inputs with the same messages.
#include <cstdint>
#include <optional>
#include <vector>

#include "nn/backend.h"

namespace trainer {

// Checks logits [N, K] (K >= 1) and returns K.
int64_t check_logits(const Tensor& logits, const char* op);
// Checks targets are i64 [n].
void check_targets_shape(const Tensor& targets, int64_t n, const char* op);
// Checks shape and that every target is in [0, k); returns them as a contiguous host tensor.
Tensor host_targets_in_range(const Tensor& targets, int64_t n, int64_t k, const char* op);
void check_label_smoothing(double eps, const char* op);
// Checks a non-finite flag: i64 [1] on `device`.
void check_flag(const Tensor& flag, Device device, const char* op);
// Checks a counter: one i64 element.
void check_counter(const Tensor& counter, const char* op);
// Backend::count_updates' arguments: counts a contiguous i64 vector, every row an index into it.
void check_update_counts(const Tensor& counts, const std::vector<int64_t>& rows);
// Checks a loss scale on a device: f32 [1] on `device`.
void check_loss_scale(const Tensor& scale, Device device, const char* op);
// Checks update_loss_scale's state: scale f32 [1], tracker and flag i64 [1], skipped f64 [1], one device.
void check_loss_scale_state(const Tensor& scale, const Tensor& tracker, const Tensor& skipped,
                            const Tensor& flag, const LossScaleRule& rule, const char* op);

// torch.optim.AdamW's per-step scalars (single-tensor path), computed on the host in double.
struct AdamWScalars {
  double step_size;              // lr / (1 - beta1^t)
  double bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};
AdamWScalars adamw_scalars(const AdamWParams& p);  // throws unless p.step >= 1

// timm's Lamb's bias corrections for update `step` (1-based).
struct LambScalars {
  double bias_correction1;       // 1 - beta1^t
  double bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};
LambScalars lamb_scalars(const LambParams& p, int64_t step);  // throws unless step >= 1

// ema_update's arguments: every average dense, on `device`, with its value's shape, dtype and strides
// (floating or i64; `copy` for floating ones only matters), updates i64 [1] on `device`.
void check_ema_update(const std::vector<Backend::EmaPair>& pairs, const Tensor& updates, Device device);
// add_squared_norms' arguments: floating tensors on `device`, out f64 [1] there.
void check_squared_norms(const std::vector<const Tensor*>& tensors, const Tensor& out, Device device);
// clip_by_total_norm's: max_norm finite and >= 0, dense f32 or f64 tensors on `device`, norm_out f64 [1]
// there.
void check_clip_by_total_norm(const std::vector<Tensor*>& tensors, double max_norm, const Tensor& norm_out,
                              Device device);

// sync_bn_global_stats' arguments: packed sums of 2C + 1 values, f32 or f64 statistics, running
// statistics both defined or neither. Returns C.
int64_t check_sync_bn_global_stats(const Tensor& packed, DType stats, const Tensor& running_mean,
                                   const Tensor& running_var);

// layer_norm's arguments: x dense (contiguous in its memory format) and floating, normalized_size >= 1
// dividing its element count, gamma and beta [normalized_size] in x's dtype or accumulate_dtype(x), or
// undefined (gamma alone, or both; not beta alone). Returns the row count.
int64_t check_layer_norm(const Tensor& x, int64_t normalized_size, const Tensor& gamma, const Tensor& beta,
                         const char* op);
// binary's operand dtypes: the same, or (add only) an f32 a beside a half b of a's shape. Returns
// whether they differ.
bool check_binary_dtypes(BinaryOp op, const Tensor& a, const Tensor& b, const char* op_name);
// layer_norm's output dtype: x's, or a half dtype beside an f32 x.
void check_layer_norm_output_dtype(DType y_dtype, DType x_dtype, const char* op);
// layer_norm_backward's: x as above, grad_y of x's shape in x's dtype or a half one beside an f32 x
// (a y_dtype layer_norm accepts), mean and rstd [rows] in
// accumulate_dtype(x), gamma as above. Returns normalized_size (the row length).
int64_t check_layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& gamma, const char* op);
// softmax's input: a floating tensor of at least one dimension. Returns the row length (its last size).
int64_t check_softmax(const Tensor& x, const char* op);
// softmax_backward's: grad_y and y of one shape and dtype. Returns the row length.
int64_t check_softmax_backward(const Tensor& grad_y, const Tensor& y, const char* op);

// bmm's sizes: batch, and op(a[i]) [m, k] @ op(b[i]) [k, n].
struct BmmSizes {
  int64_t batch, m, k, n;
};
// bmm's arguments: 3-D a and b of one dtype and batch size whose inner dimensions agree after the
// transpositions.
BmmSizes check_bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, const char* op);

// The matrices of a 3-D tensor [batch, rows, cols] as BLAS reads them in place: element (i, j) of
// matrix b at b * batch_stride + i * ld + j (row_major) or + i + j * ld (column-major, a transposed
// view). nullopt when the last two dimensions have neither layout (the caller copies).
struct BatchedMatrixLayout {
  bool row_major;
  int64_t ld, batch_stride;
};
std::optional<BatchedMatrixLayout> batched_matrix_layout(const Tensor& t);

}  // namespace trainer
