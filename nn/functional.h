#pragma once
// Differentiable ops on Variables. Each op computes its result through the device's Backend and
// records one gradient closure (nn/autograd/variable.h). One op family per file in nn/functional/.
#include <cstdint>
#include <optional>
#include <vector>

#include "nn/autograd/variable.h"
#include "nn/backend.h"

namespace trainer {

class Generator;

namespace F {

// ---- elementwise (nn/functional/elementwise.cpp); binary ops broadcast numpy-style
Variable add(const Variable& a, const Variable& b);
Variable sub(const Variable& a, const Variable& b);
Variable mul(const Variable& a, const Variable& b);
Variable div(const Variable& a, const Variable& b);
Variable add(const Variable& a, double s);
Variable sub(const Variable& a, double s);
Variable rsub(double s, const Variable& a);  // s - a
Variable mul(const Variable& a, double s);
Variable div(const Variable& a, double s);
Variable rdiv(double s, const Variable& a);  // s / a
Variable neg(const Variable& a);
Variable relu(const Variable& a);
Variable sigmoid(const Variable& a);
Variable exp(const Variable& a);
Variable log(const Variable& a);
Variable sqrt(const Variable& a);
Variable square(const Variable& a);
// torch.nn.functional.gelu: x * Phi(x) (erf, PyTorch's default approximate='none'), or its tanh
// approximation (approximate='tanh'). Like relu, it runs in the dtype it is given under autocast.
enum class GeluApproximation : uint8_t { none, tanh };
Variable gelu(const Variable& a, GeluApproximation approximate = GeluApproximation::none);

// ---- reductions (nn/functional/reduce.cpp); empty dims reduce over everything
Variable sum(const Variable& a, const std::vector<int>& dims = {}, bool keepdim = false);
Variable mean(const Variable& a, const std::vector<int>& dims = {}, bool keepdim = false);
// Sums a broadcast gradient back down to `shape` (the adjoint of broadcasting).
Tensor sum_to_shape(const Tensor& grad, const Shape& shape);

// ---- shape (nn/functional/shape.cpp)
Variable reshape(const Variable& a, const Shape& shape);
Variable flatten(const Variable& a, int start_dim = 1);  // [N, ...] -> [N, prod(...)]
Variable permute(const Variable& a, const std::vector<int>& order);
Variable contiguous(const Variable& a, MemoryFormat format = MemoryFormat::contiguous);
// Repeats a's size-1 dimensions up to `shape` (dims align to the right, as torch's expand); the
// gradient is summed back. The result is a materialised copy.
Variable expand(const Variable& a, const Shape& shape);
// Joins tensors of one shape but for `dim` along `dim` (torch.cat).
Variable cat(const std::vector<Variable>& parts, int dim);
// a's elements start <= i < end along `dim` (a[:, start:end] for dim 1), as a view; the gradient is
// zero outside the range.
Variable slice(const Variable& a, int dim, int64_t start, int64_t end);
// Converts to `dtype` (and `format`, when given); the gradient flows back in a's dtype and layout.
// Autocast's casts.
Variable to_dtype(const Variable& a, DType dtype, std::optional<MemoryFormat> format = std::nullopt);

// ---- matmul (nn/functional/matmul.cpp)
Variable matmul(const Variable& a, const Variable& b);  // [M, K] @ [K, N]
// Batched: [B, M, K] @ [B, K, N] -> [B, M, N], one product per batch entry. Permuted views (a batch
// of transposed matrices, k^T in attention) are read in place. Autocast as matmul.
Variable bmm(const Variable& a, const Variable& b);
// y = x @ weight^T + bias, as torch.nn.functional.linear: x [..., in] (the leading dimensions are
// flattened into one GEMM's rows: free for a contiguous x, a copy otherwise), weight [out, in], bias
// [out] or undefined; y [..., out], contiguous.
Variable linear(const Variable& x, const Variable& weight, const Variable& bias);

// ---- convolution and pooling (nn/functional/conv.cpp, nn/functional/pool.cpp)
Variable conv2d(const Variable& x, const Variable& weight, const Variable& bias, const Conv2dParams& p);
Variable max_pool2d(const Variable& x, const Pool2dParams& p);
Variable avg_pool2d(const Variable& x, const Pool2dParams& p);
Variable global_avg_pool(const Variable& x);  // [N, C, H, W] -> [N, C]

// ---- normalisation and regularisation (nn/functional/batch_norm.cpp, nn/functional/dropout.cpp,
// nn/functional/layer_norm.cpp)
// Training mode normalises with batch statistics and updates running_mean/running_var in place
// (momentum as PyTorch: running = (1 - m) * running + m * batch; unbiased variance); evaluation
// mode uses the running statistics. weight/bias may be undefined. With a residual and/or relu the
// result is relu(batch_norm(x) + residual) in one pass (a ResNet block's tail); the gradient is the
// unfused ops' gradient.
Variable batch_norm(const Variable& x, const Variable& weight, const Variable& bias, Tensor& running_mean,
                    Tensor& running_var, bool training, double momentum, double eps,
                    const Variable& residual = Variable(), bool relu = false);
Variable dropout(const Variable& x, double p, bool training, Generator& gen);
// Stochastic depth, as torchvision.ops.stochastic_depth(x, p, mode="row"): in training each sample
// (index of dimension 0) is zeroed with probability p and the others are scaled by 1 / (1 - p), one
// draw per sample from gen; the identity in evaluation or at p = 0. p must be in [0, 1).
Variable drop_path(const Variable& x, double p, bool training, Generator& gen);
// drop_path's pieces, for ops that apply its mask inside a fused kernel (F::scaled_residual_add): the
// per-sample mask for x, [N, 1, ..., 1] of 0 or 1 / (1 - p) in x's dtype, drawn from gen as drop_path
// draws it; and x * mask with the mask a constant (the gradient is grad * mask).
Tensor drop_path_mask(const Variable& x, double p, Generator& gen);
Variable multiply_by_mask(const char* name, const Variable& x, const Tensor& mask);
// torch.nn.functional.layer_norm over one dimension of size normalized_size: the dimension innermost in
// memory, which is the last one of a contiguous tensor (a transformer's [..., C]) and C of a
// channels-last [N, C, H, W] tensor (ConvNeXt's LayerNorm2d, with no permute); a 4-D tensor whose
// memory order is the same in both formats reads as suggest_memory_format() says. Any other layout, or a
// normalized dimension whose size is not normalized_size, throws std::invalid_argument (make the input
// .contiguous() or .contiguous(channels_last) first). weight/bias [normalized_size] or undefined. The
// result has x's layout and dtype, or y_dtype: a half dtype beside an f32 x, where the caller knows that
// the result only feeds autocast's matmuls, which would round it to that dtype anyway (the kernel
// stores it rounded). Under autocast a half x stays half (see nn/functional/layer_norm.cpp).
Variable layer_norm(const Variable& x, int64_t normalized_size, const Variable& weight, const Variable& bias,
                    double eps = 1e-5, std::optional<DType> y_dtype = std::nullopt);
// A pre-norm transformer's residual join and the layer norm after it: {h, y} with h = add(x, branch)
// and y = layer_norm(h, ...) exactly as the two ops give them (branch of x's shape; a half branch beside
// an f32 x is widened as add widens it). Where the backend fuses them (Backend::add_layer_norm) one pass
// writes h and y, and one backward pass takes both outputs' gradients: the norm's, plus what h's
// other consumers (the next residual add) sent, into x's and branch's.
std::pair<Variable, Variable> add_layer_norm(const Variable& x, const Variable& branch,
                                             int64_t normalized_size, const Variable& weight,
                                             const Variable& bias, double eps = 1e-5,
                                             std::optional<DType> y_dtype = std::nullopt);

// ---- softmax (nn/functional/softmax.cpp): torch.softmax(x, dim=-1), numerically stable (the row's
// maximum is subtracted). Any layout; the result is contiguous, in x's dtype.
Variable softmax(const Variable& x);

// ---- the end of a scaled residual branch (nn/functional/scaled_residual.cpp), ConvNeXt's
// `x + stochastic_depth(layer_scale * h)`: x + drop_path(h * scale, p) with x and h [N, ..., C] (C
// innermost in memory, contiguous) and scale [C], the mask drawn as F::drop_path draws it (none unless
// training and p > 0). One kernel each way where the backend has it (Backend::scaled_residual_add: an
// f32 scale read as f32, the result rounded once), else composed of mul and add (an f32 scale beside a
// half h cast to h's dtype first, as the linears' weights are).
Variable scaled_residual_add(const Variable& x, const Variable& h, const Variable& scale, double p,
                             bool training, Generator* gen);
// The same with drop path's mask given ([N, 1, ..., 1] in h's dtype, as drop_path_mask draws it; undefined:
// no drop path).
Variable scaled_residual_add(const Variable& x, const Variable& h, const Variable& scale, const Tensor& mask);

// ---- attention (nn/functional/attention.cpp): torch.nn.functional.scaled_dot_product_attention
// without mask or dropout: softmax(q k^T / sqrt(d)) v per batch entry and head. q [B, H, T, d],
// k [B, H, S, d], v [B, H, S, dv] -> [B, H, T, dv] (any strides), differentiable in all three. The
// backend's fused kernel where it has one for the inputs (Backend::fused_attention: cuDNN's flash
// attention for bf16/f16 on a GPU), else composed of bmm and softmax.
Variable scaled_dot_product_attention(const Variable& q, const Variable& k, const Variable& v);
// Self-attention over a packed projection, as MultiheadAttention computes it: qkv [N, T, 3, H, d] (q, k
// and v stacked) -> [N, T, H, d], each token's heads side by side. The fused kernel reads q, k and v
// in place and writes the packed gradient directly, so no permute copy is made either way.
Variable packed_self_attention(const Variable& qkv);

// ---- loss and metrics (nn/functional/loss.cpp). logits [N, K], targets i64 [N].
// Mean cross-entropy with label smoothing (PyTorch's CrossEntropyLoss(label_smoothing=...)).
Variable cross_entropy(const Variable& logits, const Tensor& targets, double label_smoothing = 0.0);
// Number of samples whose target is among the top-k logits.
int64_t topk_correct(const Tensor& logits, const Tensor& targets, int k);
// Losses against soft targets [N, K] (smoothed and mixed one-hots, Backend::mix_targets), averaged over
// the batch: -sum_k t_k log_softmax(x)_k (timm's SoftTargetCrossEntropy), and binary cross-entropy with
// logits averaged over every element (torch's binary_cross_entropy_with_logits, reduction "mean").
// Gradients flow to the logits only; half logits are cast to f32 under autocast, as cross_entropy's.
Variable soft_cross_entropy(const Variable& logits, const Tensor& targets);
Variable bce_with_logits(const Variable& logits, const Tensor& targets);

}  // namespace F
}  // namespace trainer
