#pragma once
// The single dispatch point between autograd functions and device kernels. Every kernel an image
// classifier needs is a virtual here; the CPU backend implements them in nn/cpu/<family>.cpp and the
// CUDA backend in nn/cuda/<family>.cu. A new op is one virtual, one implementation per backend, one
// autograd function in nn/functional/ and its test.
//
// Conventions: kernels return fresh tensors; inputs may have any strides unless a kernel says
// "contiguous"; floating kernels accept f32 and f64 on the CPU (f64 exists for gradient checks).
// NCHW is the logical shape of image tensors whatever their memory format.
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "nn/tensor.h"

namespace trainer {

class Generator;

enum class BinaryOp : uint8_t { add, sub, mul, div };
// gelu_erf is x * Phi(x) (torch.nn.GELU's default, approximate='none'); gelu_tanh is its tanh
// approximation (approximate='tanh').
enum class UnaryOp : uint8_t { neg, relu, sigmoid, exp, log, sqrt, square, abs, gelu_erf, gelu_tanh };

struct Conv2dParams {
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int dilation_h = 1, dilation_w = 1;
  int groups = 1;
};

struct Pool2dParams {
  int kernel_h = 2, kernel_w = 2;
  int stride_h = 2, stride_w = 2;
  int pad_h = 0, pad_w = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;  // avg pool only, PyTorch's default
};

// Output spatial size of a convolution or pooling window (PyTorch's formula).
int64_t conv_output_size(int64_t in, int kernel, int stride, int pad, int dilation);
int64_t pool_output_size(int64_t in, int kernel, int stride, int pad, bool ceil_mode);

// What bn_apply adds after the affine map: y = act(affine(x) + residual), act = relu or identity.
// A ResNet block's tail (batch norm, residual add, ReLU) is then one pass over memory instead of three.
struct BnEpilogue {
  Tensor residual;  // same shape as x, or undefined
  bool relu = false;
};

// bn_backward_fused's result.
struct BnGrads {
  Tensor grad_x, grad_gamma, grad_beta;
};

// bn_forward_fused's result: the output and the statistics bn_train_stats would have returned.
struct BnForward {
  Tensor y, mean, invstd;
};

// fused_attention's result. out [B, H, T, dv] in q's dtype, laid out as [B, T, H, dv] in memory (the
// heads of a token side by side: a permute away from the out-projection's [B * T, H * dv] input, no
// copy); stats f32 [B, H, T, 1]: each row's max + log(sum(exp)) of scale * q k^T, which is all the
// backward keeps of the softmax (not the [T, S] probabilities).
struct AttentionForward {
  Tensor out, stats;
};

// fused_attention_backward's result: the gradients in q's, k's and v's shapes. When q, k and v are the
// three packed_attention_head views of one [B, T, 3, H, d] tensor (MultiheadAttention's projection),
// the gradients are the same views of one fresh tensor of that layout, `packed`, so the projection's
// gradient needs no copy; `packed` is undefined otherwise.
struct AttentionGrads {
  Tensor grad_q, grad_k, grad_v, packed;
};

// q (which 0), k (1) or v (2) of a packed qkv [B, T, 3, H, d] as a [B, H, T, d] view.
Tensor packed_attention_head(const Tensor& qkv, int which);

// layer_norm's result: the output and, per row, the statistics its backward needs (as PyTorch saves
// them): the mean and rstd = 1 / sqrt(biased var + eps), [rows] in accumulate_dtype(x).
struct LayerNormForward {
  Tensor y, mean, rstd;
};

// layer_norm_backward's result; grad_gamma and grad_beta are undefined where gamma was.
struct LayerNormGrads {
  Tensor grad_x, grad_gamma, grad_beta;
};

// add_layer_norm's result: the sum h and layer_norm(h) with its statistics.
struct AddLayerNormForward {
  Tensor h, y, mean, rstd;
};

// add_layer_norm_backward's result: grad_x (h's dtype) and grad_branch (branch's dtype: the same tensor
// when that is h's), grad_gamma and grad_beta (undefined where gamma was).
struct AddLayerNormGrads {
  Tensor grad_x, grad_branch, grad_gamma, grad_beta;
};

// device_scalars (CUDA only, for captured steps; see Optimizer::use_device_scalars): where the
// kernel reads the values that change from step to step instead of taking them as arguments.
struct SgdParams {
  double lr = 0.1, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  const double* device_scalars = nullptr;  // [lr]
  // The loss scaler's found-inf flag (i64, on the parameters' device) when it decides on the device
  // (LossScaler::keep_on_device): nonzero leaves parameters and buffers as they are. Null: always update.
  const int64_t* skip_if = nullptr;
};

struct LossScaleRule {
  double growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

struct AdamWParams {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  int64_t step = 1;                        // 1-based step count for bias correction
  const double* device_scalars = nullptr;  // [lr, step_size, bias_correction2_sqrt] (adamw_scalars)
  // The loss scaler's found-inf flag, as SgdParams::skip_if: nonzero leaves everything as it is.
  const int64_t* skip_if = nullptr;
  // This parameter's count of updates applied so far (i64, on its device), when steps may be skipped on
  // a device flag: the bias correction then uses *applied_steps + 1 instead of `step`, so that a skipped
  // step does not count (torch.optim.AdamW is not called for a step GradScaler skips). step_size and
  // bias_correction2_sqrt are computed from it; the learning rate still comes from device_scalars or lr.
  const int64_t* applied_steps = nullptr;
};

// Backend::ema_update: the decay rule of timm's ModelEmaV3 (nn/optim/update_rules.h: ema_decay) and
// where the step's verdicts live. The k-th applied update (k = *updates + 1) uses the decay of step
// k * every_steps.
struct EmaRule {
  double decay = 0.9999, min_decay = 0.0;
  bool warmup = false;
  double warmup_gamma = 1.0, warmup_power = 2.0 / 3.0;
  int64_t every_steps = 1;
};
struct EmaParams {
  EmaRule rule;
  // The loss scaler's found-inf flag (as SgdParams::skip_if): nonzero leaves everything as it is.
  const int64_t* skip_if = nullptr;
  // Nonzero or null: this step updates. Zero: it does not (ema.every_steps inside a CUDA graph, where the
  // host stages the verdict before each replay).
  const int64_t* gate = nullptr;
};

// Backend::lamb_step: timm's Lamb (bias correction, grad averaging, coupled weight decay, the trust
// ratio of nn/optim/update_rules.h, global gradient-norm clipping).
struct LambParams {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-6, weight_decay = 0.01;
  bool trust_clip = false, always_adapt = false;
  int64_t step = 1;                        // 1-based, for the bias correction
  const double* device_scalars = nullptr;  // [lr, bias_correction1, sqrt(bias_correction2)]
  const int64_t* skip_if = nullptr;        // as AdamWParams::skip_if
  const int64_t* applied_steps = nullptr;  // as AdamWParams::applied_steps
  // max_grad_norm > 0: the gradient is divided by max(sqrt(*grad_sq_norm) / max_grad_norm, 1), where
  // grad_sq_norm (f64, on the parameter's device) is the squared norm of every gradient of the step
  // (Backend::add_squared_norms).
  double max_grad_norm = 0.0;
  const double* grad_sq_norm = nullptr;
};

// Backend::lars_step: timm's Lars (trust ratio with coefficient and eps, optional LARC clipping,
// coupled weight decay inside the adaptation, then SGD's momentum with dampening and Nesterov).
struct LarsParams {
  double lr = 1.0, momentum = 0.0, dampening = 0.0, weight_decay = 0.0, trust_coeff = 1e-3, eps = 1e-8;
  bool nesterov = false, trust_clip = false, always_adapt = false;
  const double* device_scalars = nullptr;  // [lr]
  const int64_t* skip_if = nullptr;        // as SgdParams::skip_if
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- memory: copy between any layouts/dtypes (and to/from host for device backends), fill.
  virtual void copy(Tensor& dst, const Tensor& src) = 0;
  virtual void fill(Tensor& dst, double value) = 0;

  // ---- elementwise (nn/cpu/elementwise.cpp). Binary ops broadcast numpy-style. a and b share a dtype,
  // except that add takes an f32 a beside a half b of a's shape and returns f32 (PyTorch's promotion;
  // b is widened as it is read): a transformer's f32 residual stream plus a half branch, without the
  // pass that would widen the branch first.
  virtual Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) = 0;
  // a op s, or s op a when scalar_first (for s - a and s / a).
  virtual Tensor binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first) = 0;
  virtual Tensor unary(UnaryOp op, const Tensor& a) = 0;
  // Gradient of unary op given the input x and the output y (either may be used).
  virtual Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y) = 0;
  // dst += alpha * src, same shape; dst contiguous. Used to accumulate gradients.
  virtual void axpy(Tensor& dst, const Tensor& src, double alpha) = 0;
  // unary_backward(relu, binary(add, a, b), {}, relu_out), bit for bit, in one pass on the GPU: the
  // gradient of a residual block's output (two parts) through the ReLU that made it.
  virtual Tensor relu_backward_of_sum(const Tensor& a, const Tensor& b, const Tensor& relu_out) = 0;
  // dst *= alpha in place.
  virtual void scale(Tensor& dst, double alpha) = 0;
  // counter (an i64 scalar) += amount, in place on its device: BatchNorm's num_batches_tracked counts
  // on the device, with no host copy to keep in step, so a captured step counts on every replay.
  virtual void add_to_counter(Tensor& counter, int64_t amount) = 0;

  // ---- reductions (nn/cpu/reduce.cpp)
  virtual Tensor sum(const Tensor& a, const std::vector<int>& dims, bool keepdim) = 0;
  // Materialises a broadcast of a to shape (a's dims align to the right, size-1 dims repeat).
  virtual Tensor broadcast_to(const Tensor& a, const Shape& shape) = 0;
  // Whether every element is finite (the loss scaler's check).
  virtual bool all_finite(const Tensor& a) = 0;
  // dst *= alpha in place, and sets flag (i64 [1] on dst's device) to 1 when an element of dst is inf
  // or NaN; the flag is never cleared, so one read after many calls checks them all (the loss scaler
  // unscales every gradient with one host synchronisation per step instead of one per tensor).
  virtual void scale_and_flag_nonfinite(Tensor& dst, double alpha, Tensor& flag) = 0;
  // The same with the factor 1 / scale[0] read on the device (scale: f32 [1] on dst's device), for a
  // loss scaler kept there: no host value is baked into the launch, so a captured step replays it.
  // Both flag a value that is non-finite after the multiplication, which includes every non-finite
  // input; GradScaler checks the input only, so the two differ only where a finite gradient
  // overflows when unscaled by a scale below 1 (GradScaler would pass the inf to the optimizer).
  virtual void unscale_and_flag_nonfinite(Tensor& dst, const Tensor& scale, Tensor& flag) = 0;
  // torch.amp.GradScaler's update, on the device: flag set -> scale *= backoff_factor, tracker = 0,
  // skipped += 1; otherwise ++tracker (consecutive clean steps), and at growth_interval
  // scale *= growth_factor when that is finite in f32, tracker = 0.
  // Then clears the flag for the next step. scale f32 [1], tracker and flag i64 [1], skipped f64 [1]
  // (a count the host reads back without stopping), all on one device.
  virtual void update_loss_scale(Tensor& scale, Tensor& tracker, Tensor& skipped, Tensor& flag,
                                 const LossScaleRule& rule) = 0;

  // ---- matmul (nn/cpu/matmul.cpp): op(a) @ op(b) for 2-D tensors.
  virtual Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) = 0;
  // op(a[i]) @ op(b[i]) for each i of 3-D tensors: a [B, M, K] ([B, K, M] with trans_a), b [B, K, N]
  // ([B, N, K] with trans_b) -> [B, M, N], contiguous (attention's q k^T and p v per head). A batch
  // of transposed matrices (a permuted view) is read in place.
  virtual Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) = 0;

  // A linear layer's forward as one GEMM with the bias added in its epilogue, where the backend has
  // such a GEMM for these operands: x [M, in] @ w [out, in]^T + bias [out] -> [M, out]; nullopt
  // otherwise, and the caller runs matmul and a row-broadcast add. CUDA: cuBLASLt's BIAS epilogue,
  // which saves the add's read and write of [M, out].
  virtual std::optional<Tensor> linear_fused(const Tensor& x, const Tensor& w, const Tensor& bias) {
    (void)x, (void)w, (void)bias;
    return std::nullopt;
  }
  // A linear layer's weight and bias gradients in one GEMM, where the backend can: {g^T @ x [out, in],
  // the column sums of g [out]} for g [M, out] and x [M, in]; nullopt otherwise, and the caller runs
  // matmul and sum. CUDA: cuBLASLt's BGRADB epilogue sums g while the GEMM reads it anyway.
  virtual std::optional<std::pair<Tensor, Tensor>> linear_weight_grads_fused(const Tensor& g,
                                                                             const Tensor& x) {
    (void)g, (void)x;
    return std::nullopt;
  }

  // ---- convolution (nn/cpu/conv.cpp). x [N, C, H, W], w [O, C/groups, KH, KW], bias [O] or undefined.
  virtual Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) = 0;
  virtual Tensor conv2d_backward_input(const Tensor& grad_y, const Tensor& w, const Shape& x_shape,
                                       const Conv2dParams& p) = 0;
  virtual Tensor conv2d_backward_weight(const Tensor& grad_y, const Tensor& x, const Shape& w_shape,
                                        const Conv2dParams& p) = 0;
  // conv2d_backward_weight and the bias gradient (grad_y summed over N, H, W: [O] in grad_y's dtype)
  // from one pass over grad_y, where the backend's kernel for this convolution gives both; nullopt
  // otherwise, and the caller sums grad_y. CUDA: the depthwise kernels (ConvNeXt's 7x7, whose bias
  // gradient is otherwise a column sum over the block's largest activation).
  virtual std::optional<std::pair<Tensor, Tensor>> conv2d_weight_and_bias_grads_fused(const Tensor& grad_y,
                                                                                      const Tensor& x,
                                                                                      const Shape& w_shape,
                                                                                      const Conv2dParams& p) {
    (void)grad_y, (void)x, (void)w_shape, (void)p;
    return std::nullopt;
  }

  // ---- pooling (nn/cpu/pool.cpp). max_pool2d returns {y, argmax indices}: i64 positions into H*W, or
  // (a backend's choice, CUDA's channels-last kernels) u8 offsets within the window from its padded
  // origin. max_pool2d_backward takes what the same backend's max_pool2d returned.
  virtual std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dParams& p) = 0;
  virtual Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& indices, const Shape& x_shape,
                                     const Pool2dParams& p) = 0;
  virtual Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p) = 0;
  virtual Tensor avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape, const Pool2dParams& p) = 0;
  // Mean over H and W: [N, C, H, W] -> [N, C].
  virtual Tensor global_avg_pool(const Tensor& x) = 0;
  // The gradient comes back in `format`, the input's layout (a channels-last network stays so).
  virtual Tensor global_avg_pool_backward(const Tensor& grad_y, const Shape& x_shape,
                                          MemoryFormat format) = 0;

  // ---- batch norm (nn/cpu/batch_norm.cpp), split like PyTorch's SyncBatchNorm so that the
  // per-channel statistics can be all-reduced between the pieces. x [N, C, H, W]; per-channel
  // tensors are [C] in x's dtype.
  // Per-channel mean and biased variance over N, H, W: {mean, var}.
  virtual std::pair<Tensor, Tensor> bn_mean_var(const Tensor& x) = 0;
  // Training-mode statistics: {mean, invstd = 1 / sqrt(var + eps)} per channel (var biased; both in
  // accumulate_dtype(x)). When running_mean/running_var are defined (dense [C], f32 or f64, on x's
  // device) they move towards the batch in place, as torch.nn.BatchNorm2d's do: running =
  // (1 - momentum) * running + momentum * batch, with the unbiased variance. The CUDA backend does
  // all of it in the statistics' one kernel instead of six small ones after it.
  virtual std::pair<Tensor, Tensor> bn_train_stats(const Tensor& x, double eps, double momentum,
                                                   Tensor& running_mean, Tensor& running_var) = 0;
  // y = act((x - mean) * invstd * gamma + beta + residual) (see BnEpilogue); gamma/beta may be
  // undefined (affine=false). The result has x's layout.
  virtual Tensor bn_apply(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                          const Tensor& beta, const BnEpilogue& epilogue) = 0;
  // {sum over N,H,W of dy, sum of dy * (x - mean) * invstd}. dy is grad_y, or with relu_out (the
  // output of a fused ReLU, see BnEpilogue) grad_y where relu_out > 0 and 0 elsewhere: the ReLU's
  // backward folded into the reads instead of a pass of its own.
  virtual std::pair<Tensor, Tensor> bn_backward_reduce(const Tensor& grad_y, const Tensor& x,
                                                       const Tensor& mean, const Tensor& invstd,
                                                       const Tensor& relu_out) = 0;
  // grad_x for training mode, given the (possibly all-reduced) sums and the total element count
  // per channel; gamma may be undefined; relu_out as above.
  virtual Tensor bn_backward_input(const Tensor& grad_y, const Tensor& x, const Tensor& mean,
                                   const Tensor& invstd, const Tensor& gamma, const Tensor& sum_dy,
                                   const Tensor& sum_dy_xhat, int64_t count, const Tensor& relu_out) = 0;

  // The backward of a training batch norm in one call, where the backend has a faster kernel for
  // this input than bn_backward_reduce + bn_backward_input: {grad_x, grad_gamma (= sum_dy_xhat),
  // grad_beta (= sum_dy)}; nullopt otherwise, and the caller runs those two. gamma, beta and eps are
  // the forward's; relu_out as above. CUDA: cuDNN's NHWC batch norm under train.cudnn_batchnorm.
  virtual std::optional<BnGrads> bn_backward_fused(const Tensor& grad_y, const Tensor& x, const Tensor& mean,
                                                   const Tensor& invstd, const Tensor& gamma,
                                                   const Tensor& beta, const Tensor& relu_out, double eps) {
    (void)grad_y, (void)x, (void)mean, (void)invstd, (void)gamma, (void)beta, (void)relu_out, (void)eps;
    return std::nullopt;
  }

  // A training batch norm's forward in one call (bn_train_stats + bn_apply with the running
  // statistics updated as there), where the backend has a faster kernel for this input; nullopt
  // otherwise, and the caller runs those two. CUDA: cuDNN's NHWC batch norm under
  // train.cudnn_batchnorm, for the shapes where it timed faster than ours.
  virtual std::optional<BnForward> bn_forward_fused(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                    Tensor& running_mean, Tensor& running_var,
                                                    double momentum, double eps, const BnEpilogue& epilogue) {
    (void)x, (void)gamma, (void)beta, (void)running_mean, (void)running_var, (void)momentum, (void)eps,
        (void)epilogue;
    return std::nullopt;
  }

  // ---- fused attention: softmax(scale * q k^T) v per batch entry and head in one kernel that never
  // writes the [T, S] scores (flash attention), where the backend has one for these inputs; nullopt
  // otherwise, and the caller composes it of bmm and softmax (nn/functional/attention.cpp), which stays
  // the reference. q [B, H, T, d], k [B, H, S, d], v [B, H, S, dv], any strides with the last dimension
  // dense (slices of a packed projection are read in place). CUDA: cuDNN's flash-attention graphs for
  // bf16/f16 on sm80+ (nn/cuda/fused_attention.h says where else).
  virtual std::optional<AttentionForward> fused_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                                          double scale) {
    (void)q, (void)k, (void)v, (void)scale;
    return std::nullopt;
  }
  // The gradients of fused_attention's output given grad_out (out's shape, any strides), from the
  // forward's inputs, out and stats; nullopt where the backend did not run that forward (the caller
  // then recomputes the composed form and differentiates it).
  virtual std::optional<AttentionGrads> fused_attention_backward(const Tensor& grad_out, const Tensor& q,
                                                                 const Tensor& k, const Tensor& v,
                                                                 const Tensor& out, const Tensor& stats,
                                                                 double scale) {
    (void)grad_out, (void)q, (void)k, (void)v, (void)out, (void)stats, (void)scale;
    return std::nullopt;
  }

  // ---- the end of a scaled residual branch (ConvNeXt's block): y = x + h * scale[c] * keep[n] in one
  // pass, where the backend has the kernel; nullopt otherwise, and the caller composes it of mul and add
  // (nn/functional/scaled_residual.cpp, the reference). x and h: one dtype, dense, contiguous, shape
  // [N, ..., C] with the channel c innermost (ConvNeXt's NHWC view); scale [C] in f32 or h's dtype;
  // keep undefined or [N] in h's dtype (drop path's per-sample multipliers, 0 or 1 / (1 - p)). Computed
  // in f32, rounded once; y in h's dtype and shape.
  virtual std::optional<Tensor> scaled_residual_add(const Tensor& x, const Tensor& h, const Tensor& scale,
                                                    const Tensor& keep) {
    (void)x, (void)h, (void)scale, (void)keep;
    return std::nullopt;
  }
  // Its gradients for grad_y (x's shape and layout; grad_x is grad_y itself): grad_h = grad_y * scale[c]
  // * keep[n] in h's dtype, and grad_scale[c] = the sum over rows of grad_y * h * keep[n] in scale's
  // dtype, summed in f32 in a fixed order (deterministic). nullopt where the forward was not fused.
  virtual std::optional<std::pair<Tensor, Tensor>> scaled_residual_add_backward(const Tensor& grad_y,
                                                                                const Tensor& h,
                                                                                const Tensor& scale,
                                                                                const Tensor& keep) {
    (void)grad_y, (void)h, (void)scale, (void)keep;
    return std::nullopt;
  }

  // ---- synchronised batch norm (nn/cpu/sync_batch_norm.cpp): the pieces dist/sync_batch_norm.cpp
  // puts around its two all-reduces. Each writes or reads the all-reduced f64 buffer in place, so a
  // layer costs a reduction and a collective each way (and one [C] kernel forward), never a host wait.
  // Sums travel in f64 as counts times moments did before: ranks with different batch sizes combine
  // exactly, and E[x^2] - mean^2 loses nothing that matters at the scale of f32 statistics.
  //
  // This rank's per-channel sums over N, H, W into `packed` (f64 [2C + 1], dense, on x's device):
  // [sum x (C) | sum x^2 (C) | values per channel]. An input without values writes zeros.
  virtual void sync_bn_local_stats(const Tensor& x, Tensor& packed) = 0;
  // From `packed` summed over every rank: {mean, invstd = 1 / sqrt(var + eps)} in `stats` dtype
  // (f32 or f64; var biased), computed as bn_train_stats computes them; running_mean/running_var (dense
  // [C], f32 or f64, or both undefined) move towards the batch's with the unbiased variance. The count
  // is read on the device; a global count <= 1 must be refused by the caller (it gives var 0).
  virtual std::pair<Tensor, Tensor> sync_bn_global_stats(const Tensor& packed, DType stats, double eps,
                                                         double momentum, Tensor& running_mean,
                                                         Tensor& running_var) = 0;
  // bn_backward_reduce's {sum_dy, sum_dy_xhat} (this rank's, for the weight and bias gradients), and the
  // same sums in f64 divided by the global count (global_stats[2C], the forward's all-reduced buffer)
  // into `packed` (f64 [2C], dense): summed over every rank they are the means bn_backward_input takes
  // with count 1, so no division is left after the all-reduce. An input without values writes zeros.
  virtual std::pair<Tensor, Tensor> sync_bn_local_grad_sums(const Tensor& grad_y, const Tensor& x,
                                                            const Tensor& mean, const Tensor& invstd,
                                                            const Tensor& global_stats, Tensor& packed) = 0;

  // ---- layer norm (nn/cpu/layer_norm.cpp). x must be dense (contiguous in its memory format); its
  // memory is read as [rows, normalized_size] and each row normalised: y = (x - mean) * rstd * gamma +
  // beta. That is the last dimension of a contiguous tensor, and the channels of a channels-last
  // [N, C, H, W] one (ConvNeXt's LayerNorm2d) with no transpose. y has x's shape and layout. gamma and
  // beta are [normalized_size], in x's dtype or accumulate_dtype(x), or undefined (no affine map).
  // Computed in f32 for half inputs (f64 on the CPU for f32 ones). y is stored in y_dtype: x's, or a
  // half dtype beside an f32 x -- the rounding autocast's next matmul would do, done by the kernel that
  // writes y (a transformer's f32 residual stream into its linears), so no cast pass reads y again.
  virtual LayerNormForward layer_norm(const Tensor& x, int64_t normalized_size, const Tensor& gamma,
                                      const Tensor& beta, double eps, DType y_dtype) = 0;
  // The gradients of layer_norm given its saved statistics: grad_x in x's dtype and layout (grad_y, in
  // x's dtype or the half y_dtype of the forward, is read as x is), grad_gamma = sum over rows of
  // grad_y * xhat and grad_beta = sum of grad_y, both [normalized_size] in accumulate_dtype(x) and
  // computed only when gamma is defined.
  virtual LayerNormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean,
                                             const Tensor& rstd, const Tensor& gamma) = 0;
  // Optional fused form of a pre-norm transformer's join: h = x + branch and y = layer_norm(h), in one
  // pass that writes both (h in x's dtype, y in y_dtype as layer_norm stores it). x is dense and
  // contiguous, read as [rows, normalized_size]; branch has x's shape and layout, in x's dtype or (f32
  // x) a half dtype widened as it is read, as Backend::binary's add does. h rounds x + branch once, as
  // add does, and y normalises that rounded h. nullopt where the backend has no kernel for these
  // operands; the caller then adds and normalises apart (the composed form is the reference).
  virtual std::optional<AddLayerNormForward> add_layer_norm(const Tensor& x, const Tensor& branch,
                                                            int64_t normalized_size, const Tensor& gamma,
                                                            const Tensor& beta, double eps, DType y_dtype) {
    (void)x, (void)branch, (void)normalized_size, (void)gamma, (void)beta, (void)eps, (void)y_dtype;
    return std::nullopt;
  }
  // Its gradients: grad_h = layer_norm_backward(grad_y)'s grad_x + grad_h_in (the gradient h's other
  // consumers sent; undefined: none), which is x's gradient (in h's dtype) and branch's (also written
  // in branch_dtype when that differs, by the same pass); grad_gamma and grad_beta as layer_norm_backward
  // gives them. grad_y is in h's dtype or the forward's half y_dtype. nullopt where the forward was not
  // fused.
  virtual std::optional<AddLayerNormGrads> add_layer_norm_backward(const Tensor& grad_y,
                                                                   const Tensor& grad_h_in, const Tensor& h,
                                                                   const Tensor& mean, const Tensor& rstd,
                                                                   const Tensor& gamma, DType branch_dtype) {
    (void)grad_y, (void)grad_h_in, (void)h, (void)mean, (void)rstd, (void)gamma, (void)branch_dtype;
    return std::nullopt;
  }

  // ---- softmax over the last dimension (nn/cpu/softmax.cpp): y = exp(x - max) / sum(exp(x - max))
  // per row, in x's dtype, contiguous; half inputs compute in f32.
  virtual Tensor softmax(const Tensor& x) = 0;
  // grad_x = y * (grad_y - sum over the row of grad_y * y), from the forward's output y.
  virtual Tensor softmax_backward(const Tensor& grad_y, const Tensor& y) = 0;

  // ---- loss (nn/cpu/loss.cpp). logits [N, K], targets i64 [N].
  // Cross-entropy with label smoothing via a fused log-softmax; returns {per-sample loss [N],
  // softmax probabilities [N, K]} (the probabilities are what the backward needs).
  virtual std::pair<Tensor, Tensor> cross_entropy(const Tensor& logits, const Tensor& targets,
                                                  double label_smoothing) = 0;
  // d(sum_i w_i * loss_i)/d logits, with per-sample weights grad_loss [N].
  virtual Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& probs, const Tensor& targets,
                                        double label_smoothing) = 0;
  // Per sample: 1 if the target is among the k largest logits, else 0. u8 [N].
  virtual Tensor topk_correct(const Tensor& logits, const Tensor& targets, int k) = 0;
  // Index of the largest logit per row, i64 [N].
  virtual Tensor argmax(const Tensor& logits) = 0;

  // ---- soft-target losses (nn/cpu/soft_target_loss.cpp): logits [N, K], targets [N, K] floating (a
  // distribution per row: smoothed and mixed one-hots, mix_targets' output). Sums in double.
  // Cross-entropy against the targets: {per-sample loss [N] = -sum_k t_ik log_softmax(x_i)_k, softmax
  // probabilities [N, K]} (timm's SoftTargetCrossEntropy before its mean over the batch).
  virtual std::pair<Tensor, Tensor> soft_cross_entropy(const Tensor& logits, const Tensor& targets) = 0;
  // d(sum_i w_i * loss_i)/d logits = w_i * (p_ik * sum_k t_ik - t_ik), with w = grad_loss [N].
  virtual Tensor soft_cross_entropy_backward(const Tensor& grad_loss, const Tensor& probs,
                                             const Tensor& targets) = 0;
  // Binary cross-entropy with logits, averaged over the K classes of each sample: loss_i = mean_k
  // (max(x, 0) - x t + log(1 + exp(-|x|))) [N], so its mean over N is torch's reduction="mean".
  virtual Tensor bce_with_logits(const Tensor& logits, const Tensor& targets) = 0;
  // d(sum_i w_i * loss_i)/d logits = w_i * (sigmoid(x_ik) - t_ik) / K.
  virtual Tensor bce_with_logits_backward(const Tensor& grad_loss, const Tensor& logits,
                                          const Tensor& targets) = 0;

  // ---- batch mixing (nn/cpu/batch_mix.cpp): Mixup and CutMix of a batch with its reverse (timm's
  // mode "batch"). `draws` is f64 [kMixDrawValues] on the batch's device (nn/batch_mix_math.h: cutmix
  // flag, lambda, box), read there by the kernels so a captured step takes new draws on every replay.
  // images [N, C, H, W] floating, any layout -> the mixed batch in the same layout: sample i becomes
  // lam * x_i + (1 - lam) * x_{N-1-i} (mixup) or x_i with the box's pixels of x_{N-1-i} (cutmix).
  virtual Tensor mix_images(const Tensor& images, const Tensor& draws) = 0;
  // labels i64 [N] -> targets [N, classes] in `dtype`: lam * smooth(onehot(y_i)) + (1 - lam) *
  // smooth(onehot(y_{N-1-i})), smooth(t) = t * (1 - eps) + eps / classes (timm's mixup_target).
  virtual Tensor mix_targets(const Tensor& labels, int64_t classes, double label_smoothing,
                             const Tensor& draws, DType dtype) = 0;

  // ---- random (nn/cpu/random.cpp): mask of 0 or 1/(1-p), the dropout multiplier.
  virtual Tensor dropout_mask(const Shape& shape, double p, DType dtype, Generator& gen) = 0;

  // ---- optimizers (nn/cpu/optim.cpp), in place on contiguous tensors, PyTorch's update rules.
  virtual void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, bool first_step,
                        const SgdParams& p) = 0;
  // sgd_step for many parameters with the same hyperparameters (one optimizer group): the CUDA backend
  // updates them all in one kernel launch instead of one per parameter (resnet18 has 62). Parallel
  // lists; momentum_buffers[i] may be null without momentum; first_steps[i] as sgd_step's first_step.
  // The default calls sgd_step for each.
  struct SgdUpdate {
    Tensor* param;
    const Tensor* grad;
    Tensor* momentum_buffer;  // null without momentum
    bool first_step;
  };
  virtual void sgd_step_many(const std::vector<SgdUpdate>& updates, const SgdParams& p);
  virtual void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                          const AdamWParams& p) = 0;
  // adamw_step for many parameters of one optimizer group, as torch.optim.AdamW(fused=True): the CUDA
  // backend updates up to 36 tensors per launch instead of one launch each (a ViT-B/16 has 152). Each
  // update brings what may differ between parameters (a group's parameters can have different step
  // counts, e.g. after a freeze); p gives the rest, its step, device_scalars and applied_steps unused.
  // The default calls adamw_step for each.
  struct AdamWUpdate {
    Tensor* param;
    const Tensor* grad;
    Tensor* exp_avg;
    Tensor* exp_avg_sq;
    int64_t step;                  // AdamWParams::step
    const double* device_scalars;  // AdamWParams::device_scalars: this parameter's row, or null
    const int64_t* applied_steps;  // AdamWParams::applied_steps, or null
  };
  virtual void adamw_step_many(const std::vector<AdamWUpdate>& updates, const AdamWParams& p);
  // counts[r] += 1 for each r in rows (distinct), unless *skip_if is nonzero (skip_if may be null): the
  // updates an optimizer applied in a step whose skipping the device decides. counts is i64 [n] on this
  // backend's device, skip_if an i64 there.
  virtual void count_updates(Tensor& counts, const std::vector<int64_t>& rows, const int64_t* skip_if) = 0;

  // ---- weight averages and layer-wise adaptive optimizers (nn/cpu/optim_layerwise.cpp,
  // nn/cuda/ema.cu, nn/cuda/lamb_lars.cu).
  // One update of a model's exponential moving average, all tensors in one launch on a GPU: each
  // floating average becomes lerp(average, value, 1 - decay) (torch.lerp's formula), or a copy of value
  // where `copy` is set; integer tensors are copied. `updates` (i64 [1] on this backend's device) counts
  // the applied updates: the decay is ema_decay(rule, (*updates + 1) * every_steps), and it advances by
  // one, unless p.skip_if is set or p.gate is zero (then nothing changes).
  struct EmaPair {
    Tensor* average;
    const Tensor* value;  // same shape, dtype and layout
    bool copy;
  };
  virtual void ema_update(const std::vector<EmaPair>& pairs, Tensor& updates, const EmaParams& p) = 0;
  // out[0] += sum of the squares of every element of every tensor, in f64 (out: f64 [1] on this
  // backend's device): LAMB's global gradient norm, left on the device.
  virtual void add_squared_norms(const std::vector<const Tensor*>& tensors, Tensor& out) = 0;
  // Gradient-norm clipping left on the device (torch.nn.utils.clip_grad_norm_ without its host read, so
  // a captured step can clip): norm = the L2 norm over every element of every tensor, its squares summed
  // in f64 in an order fixed by the shapes (the same bits on every run); each tensor is then multiplied
  // in place by min(max_norm / (norm + 1e-6), 1) in its dtype, and left as it is where that is 1 (a NaN
  // norm makes every value NaN, as torch's does). Tensors: dense (contiguous in their memory format), f32
  // or f64, on this backend's device; norm_out (f64 [1] there) gets the norm.
  virtual void clip_by_total_norm(const std::vector<Tensor*>& tensors, double max_norm, Tensor& norm_out) = 0;
  virtual void lamb_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                         const LambParams& p) = 0;
  // momentum_buffer starts as the first (adapted) gradient, as sgd_step's.
  virtual void lars_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, bool first_step,
                         const LarsParams& p) = 0;
};

Backend& backend_for(Device device);
inline Backend& backend_for(const Tensor& t) { return backend_for(t.device()); }
Backend& cpu_backend();
void register_backend(DeviceKind kind, Backend* backend);

}  // namespace trainer
