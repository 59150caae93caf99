// matmul and bmm in their four transpositions, linear with its fused bias epilogues (bmm also on permuted
// views, read in place), and conv2d with both backward kernels over strides, padding, dilation, groups, 1x1
// and bias.
#include "op_case.h"

namespace trainer::op_cases {
namespace {

OpCase matmul_case(bool trans_a, bool trans_b) {
  OpCase c;
  c.name = std::string("matmul") + (trans_a ? " a^T" : " a") + (trans_b ? " b^T" : " b");
  const int64_t M = 5, K = 7, N = 3;
  c.inputs = {uniform(trans_a ? Shape{K, M} : Shape{M, K}), uniform(trans_b ? Shape{N, K} : Shape{K, N})};
  c.run = [=](Backend& b, Tensors& in) { return Tensors{b.matmul(in[0], in[1], trans_a, trans_b)}; };
  c.gradient = [=](Backend& b, Tensors& in, const Tensor& g) {
    const Tensor& x = in[0];
    const Tensor& y = in[1];
    // y = op(a) op(b): d op(a) = g op(b)^T, d op(b) = op(a)^T g, transposed back where op transposes.
    const Tensor ga = trans_a ? b.matmul(y, g, trans_b, true) : b.matmul(g, y, false, !trans_b);
    const Tensor gb = trans_b ? b.matmul(g, x, true, trans_a) : b.matmul(x, g, !trans_a, false);
    return Tensors{ga, gb};
  };
  c.differentiable = {0, 1};
  c.device_dtypes = {DType::f32, DType::bf16};
  return c;
}

// A linear layer: the fused GEMM with its bias epilogue and the fused weight + bias gradients where
// the backend has them (cuBLASLt on the GPU), matmul + add / sum otherwise (the CPU reference).
OpCase linear_case(int64_t rows, int64_t in, int64_t out) {
  OpCase c;
  c.name = "linear_fused and linear_weight_grads_fused (or matmul + add, sum) " + std::to_string(rows) + "x" +
           std::to_string(in) + " -> " + std::to_string(out);
  c.inputs = {uniform({rows, in}), uniform({out, in}), uniform({out}),
              uniform({rows, out})};  // x, w, bias, g
  auto forward = [](Backend& b, const Tensors& in) {
    if (auto y = b.linear_fused(in[0], in[1], in[2])) return *y;
    return b.binary(BinaryOp::add, b.matmul(in[0], in[1], false, true), in[2]);
  };
  auto weight_grads = [](Backend& b, const Tensor& g, const Tensor& x) {
    if (auto fused = b.linear_weight_grads_fused(g, x)) return Tensors{fused->first, fused->second};
    return Tensors{b.matmul(g, x, true, false), b.sum(g, {0}, false)};
  };
  c.run = [=](Backend& b, Tensors& in) {
    const Tensors grads = weight_grads(b, in[3], in[0]);
    return Tensors{forward(b, in), grads[0], grads[1]};
  };
  c.gradient = [=](Backend& b, Tensors& in, const Tensor& g) {
    const Tensors grads = weight_grads(b, g, in[0]);
    return Tensors{b.matmul(g, in[1], false, false), grads[0], grads[1]};
  };
  c.differentiable = {0, 1, 2};
  c.device_dtypes = {DType::f32, DType::bf16, DType::f16};
  return c;
}

// How bmm's operands are laid out in memory.
enum class BmmLayout {
  dense,          // [B, rows, cols] contiguous
  transposed,     // stored [B, cols, rows], passed as a permuted view (k^T in attention)
  heads_between,  // stored [rows, B, cols], passed permuted: row-major matrices, ld = B * cols (the
                  // [N, T, H, d] -> [N, H, T, d] view of multi-head attention)
};

Shape stored_shape(BmmLayout layout, int64_t batch, int64_t rows, int64_t cols) {
  switch (layout) {
    case BmmLayout::transposed:
      return {batch, cols, rows};
    case BmmLayout::heads_between:
      return {rows, batch, cols};
    default:
      return {batch, rows, cols};
  }
}

// The view bmm reads, and the gradient of that view brought back to the stored input's shape.
Tensor bmm_view(BmmLayout layout, const Tensor& t) {
  if (layout == BmmLayout::transposed) return t.permute({0, 2, 1});
  if (layout == BmmLayout::heads_between) return t.permute({1, 0, 2});
  return t;
}
Tensor stored_gradient(BmmLayout layout, const Tensor& g) {
  if (layout == BmmLayout::transposed) return g.permute({0, 2, 1});
  if (layout == BmmLayout::heads_between) return g.permute({1, 0, 2});
  return g;
}

// Odd sizes throughout, so no dimension is mistaken for another.
OpCase bmm_case(bool trans_a, bool trans_b, BmmLayout layout = BmmLayout::dense) {
  OpCase c;
  c.name = std::string("bmm") + (trans_a ? " a^T" : " a") + (trans_b ? " b^T" : " b") +
           (layout == BmmLayout::transposed      ? " of permuted views"
            : layout == BmmLayout::heads_between ? " of [rows, B, cols] views"
                                                 : "");
  const int64_t B = 3, M = 5, K = 7, N = 11;
  const Shape a_view = trans_a ? Shape{B, K, M} : Shape{B, M, K},
              b_view = trans_b ? Shape{B, N, K} : Shape{B, K, N};
  c.inputs = {uniform(stored_shape(layout, B, a_view[1], a_view[2])),
              uniform(stored_shape(layout, B, b_view[1], b_view[2]))};
  c.run = [=](Backend& b, Tensors& in) {
    return Tensors{b.bmm(bmm_view(layout, in[0]), bmm_view(layout, in[1]), trans_a, trans_b)};
  };
  c.gradient = [=](Backend& b, Tensors& in, const Tensor& g) {
    const Tensor x = bmm_view(layout, in[0]), y = bmm_view(layout, in[1]);
    // As matmul's, per matrix.
    const Tensor ga = trans_a ? b.bmm(y, g, trans_b, true) : b.bmm(g, y, false, !trans_b);
    const Tensor gb = trans_b ? b.bmm(g, x, true, trans_a) : b.bmm(x, g, !trans_a, false);
    return Tensors{stored_gradient(layout, ga), stored_gradient(layout, gb)};
  };
  c.differentiable = {0, 1};
  c.device_dtypes = {DType::f32, DType::bf16, DType::f16};
  return c;
}

struct ConvShape {
  std::string name;
  Shape x, w;
  Conv2dParams p;
  bool bias = true;
  bool half = true;  // also run in bf16 channels-last on the device
};

Shape conv_output(const ConvShape& s) {
  return {s.x[0], s.w[0],
          conv_output_size(s.x[2], static_cast<int>(s.w[2]), s.p.stride_h, s.p.pad_h, s.p.dilation_h),
          conv_output_size(s.x[3], static_cast<int>(s.w[3]), s.p.stride_w, s.p.pad_w, s.p.dilation_w)};
}

// The weight and bias gradients: the backend's one-pass pair where it has one, else the weight
// gradient and the sum of dy.
Tensors weight_and_bias_grads(Backend& b, const Tensor& dy, const Tensor& x, const Shape& w_shape,
                              const Conv2dParams& p) {
  if (auto both = b.conv2d_weight_and_bias_grads_fused(dy, x, w_shape, p)) return {both->first, both->second};
  return {b.conv2d_backward_weight(dy, x, w_shape, p), b.sum(dy, {0, 2, 3}, false)};
}

// Inputs x, w, bias, and dy (a fixed gradient for the device comparison of the backward kernels).
OpCase conv_case(const ConvShape& s) {
  OpCase c;
  c.name = "conv2d " + s.name;
  c.inputs = {image(s.x), uniform(s.w), uniform({s.w[0]}), image(conv_output(s))};
  const Conv2dParams p = s.p;
  const bool bias = s.bias;
  c.run = [p, bias](Backend& b, Tensors& in) {
    const Tensor& x = in[0];
    const Tensor& w = in[1];
    const Tensor y = b.conv2d(x, w, bias ? in[2] : Tensor(), p);
    Tensors out{y, b.conv2d_backward_input(in[3], w, x.shape(), p),
                b.conv2d_backward_weight(in[3], x, w.shape(), p)};
    if (bias)
      for (const Tensor& t : weight_and_bias_grads(b, in[3], x, w.shape(), p)) out.push_back(t);
    return out;
  };
  c.gradient = [p, bias](Backend& b, Tensors& in, const Tensor& g) {
    const Tensor& x = in[0];
    const Tensor& w = in[1];
    Tensors grads{b.conv2d_backward_input(g, w, x.shape(), p)};
    if (!bias) return Tensors{grads[0], b.conv2d_backward_weight(g, x, w.shape(), p)};
    for (const Tensor& t : weight_and_bias_grads(b, g, x, w.shape(), p)) grads.push_back(t);
    return grads;
  };
  c.differentiable = bias ? std::vector<int>{0, 1, 2} : std::vector<int>{0, 1};
  c.device_dtypes = s.half ? std::vector<DType>{DType::f32, DType::bf16} : std::vector<DType>{DType::f32};
  c.channels_last = true;
  c.rtol_f32 = 2e-5;
  return c;
}

}  // namespace

std::vector<OpCase> conv_matmul_cases() {
  std::vector<OpCase> cases;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) cases.push_back(matmul_case(ta, tb));
  for (bool ta : {false, true})
    for (bool tb : {false, true}) cases.push_back(bmm_case(ta, tb));
  cases.push_back(linear_case(24, 16, 8));  // cuBLASLt's alignment: its epilogues run
  cases.push_back(linear_case(5, 7, 3));    // odd sizes: cuBLASLt may decline, the pieces then
  cases.push_back(bmm_case(false, false, BmmLayout::transposed));
  cases.push_back(bmm_case(false, true, BmmLayout::heads_between));
  const std::vector<ConvShape> shapes = {
      {"3x3 pad 1", {2, 8, 7, 6}, {8, 8, 3, 3}, conv_params(1, 1)},
      {"3x3 stride 2 pad 1, no bias", {2, 8, 7, 7}, {16, 8, 3, 3}, conv_params(2, 1), false},
      {"1x1 stride 2", {2, 16, 6, 5}, {8, 16, 1, 1}, conv_params(2, 0)},
      {"7x7 stride 2 pad 3 stem, 3 channels", {2, 3, 9, 9}, {8, 3, 7, 7}, conv_params(2, 3)},
      {"3x3 dilation 2 pad 2", {1, 4, 8, 7}, {4, 4, 3, 3}, conv_params(1, 2, 2), true, false},
      {"3x3 groups 2", {2, 4, 6, 6}, {6, 2, 3, 3}, conv_params(1, 1, 1, 2), true, false},
      {"depthwise 3x3 (groups = channels)", {2, 8, 5, 6}, {8, 1, 3, 3}, conv_params(1, 1, 1, 8), true, false},
      // ConvNeXt's three convolutions: the block's depthwise 7x7, the downsampling 2x2/2, the patch stem.
      {"depthwise 7x7 pad 3 (ConvNeXt block)", {2, 16, 7, 7}, {16, 1, 7, 7}, conv_params(1, 3, 1, 16)},
      // 6 channels: one channel per thread in half precision on the GPU's depthwise kernels; 9x11 plane.
      {"depthwise 5x5 pad 2, 6 channels, no bias",
       {2, 6, 9, 11},
       {6, 1, 5, 5},
       conv_params(1, 2, 1, 6),
       false},
      {"2x2 stride 2 (ConvNeXt downsampling)", {2, 8, 6, 6}, {16, 8, 2, 2}, conv_params(2, 0)},
      {"4x4 stride 4 patch stem, 3 channels", {2, 3, 8, 8}, {8, 3, 4, 4}, conv_params(4, 0)},
      {"5x3 kernel, 4x2 pad",
       {1, 3, 8, 6},
       {4, 3, 5, 3},
       [] {
         Conv2dParams p;
         p.pad_h = 2, p.pad_w = 1;
         return p;
       }(),
       true,
       false},
  };
  for (const ConvShape& s : shapes) cases.push_back(conv_case(s));
  return cases;
}

}  // namespace trainer::op_cases
