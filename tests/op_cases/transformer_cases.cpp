// The ops a ViT or ConvNeXt adds to a ResNet's: layer norm (over the last dimension, and over the
// channels of a channels-last image batch), softmax over the last dimension, GELU in both forms over
// the range where its curve bends (the elementwise family checks them on [-1, 1] like every unary op),
// and attention (fused where the backend has it, composed of bmm and softmax otherwise). Each case runs
// its backward on a listed dy too, so the device comparison covers it.
#include <cmath>

#include "nn/composed_attention.h"
#include "op_case.h"

namespace trainer::op_cases {
namespace {

constexpr double kEps = 1e-5;

// The input as layer_norm reads it: the normalised dimension innermost in memory.
Tensor normalised_layout(const Tensor& x, bool over_channels) {
  return over_channels ? x.contiguous(MemoryFormat::channels_last) : x;
}

InputSpec values(Shape shape, bool image_batch, double lo, double hi) {
  InputSpec s = image_batch ? image(std::move(shape)) : uniform(std::move(shape));
  s.lo = lo, s.hi = hi;
  return s;
}

struct LayerNormSetup {
  Shape x;
  int64_t normalized_size;
  bool affine = true;
  bool over_channels = false;  // x is [N, C, H, W], normalised over C in channels-last memory
  double lo = -2.0, hi = 3.0;
  // An f32 x's output stored as bf16 (a transformer's f32 residual stream into its linears), its
  // gradient read as bf16; the f64 reference keeps f64.
  bool half_output = false;
};

// Inputs: x, [gamma, beta,] dy. Outputs: y, mean, rstd, then the gradients for dy.
OpCase layer_norm_case(const std::string& what, const LayerNormSetup& s) {
  OpCase c;
  c.name = "layer_norm and layer_norm_backward " + what;
  c.inputs = {values(s.x, s.over_channels, s.lo, s.hi)};
  if (s.affine) {
    c.inputs.push_back(uniform({s.normalized_size}, 0.5, 1.5));
    c.inputs.push_back(uniform({s.normalized_size}));
  }
  c.inputs.push_back(values(s.x, s.over_channels, -1.0, 1.0));  // dy
  auto forward = [s](Backend& b, Tensors& in) {
    const Tensor gamma = s.affine ? in[1] : Tensor(), beta = s.affine ? in[2] : Tensor();
    const DType x_dtype = in[0].dtype();
    const DType y_dtype = s.half_output && x_dtype == DType::f32 ? DType::bf16 : x_dtype;
    return b.layer_norm(normalised_layout(in[0], s.over_channels), s.normalized_size, gamma, beta, kEps,
                        y_dtype);
  };
  // dy is passed in its own layout (and y's dtype): the kernels read it as they read x.
  auto backward = [s](Backend& b, Tensors& in, const LayerNormForward& f, const Tensor& dy) {
    const LayerNormGrads g =
        b.layer_norm_backward(dy.to(f.y.dtype()), normalised_layout(in[0], s.over_channels), f.mean, f.rstd,
                              s.affine ? in[1] : Tensor());
    Tensors grads{g.grad_x};
    if (s.affine) grads.push_back(g.grad_gamma), grads.push_back(g.grad_beta);
    return grads;
  };
  c.run = [forward, backward](Backend& b, Tensors& in) {
    const LayerNormForward f = forward(b, in);
    Tensors out{f.y, f.mean, f.rstd};
    for (const Tensor& g : backward(b, in, f, in.back())) out.push_back(g);
    return out;
  };
  c.gradient = [forward, backward](Backend& b, Tensors& in, const Tensor& g) {
    return backward(b, in, forward(b, in), g);
  };
  c.differentiable = s.affine ? std::vector<int>{0, 1, 2} : std::vector<int>{0};
  c.device_dtypes = {DType::f32, DType::bf16, DType::f16};
  c.channels_last = s.over_channels;
  c.rtol_f32 = 2e-5;
  return c;
}

// Inputs: x, dy. Outputs: y and the gradient for dy. `transposed`: x is read through a transposed
// view (the kernels accept any layout).
OpCase softmax_case(const std::string& what, Shape shape, double lo, double hi, bool transposed = false) {
  OpCase c;
  c.name = "softmax and softmax_backward " + what;
  const Shape x_shape = transposed ? Shape{shape[1], shape[0]} : shape;
  c.inputs = {uniform(x_shape, lo, hi), uniform(shape)};
  auto view = [transposed](const Tensor& x) { return transposed ? x.permute({1, 0}) : x; };
  c.run = [view](Backend& b, Tensors& in) {
    const Tensor y = b.softmax(view(in[0]));
    return Tensors{y, b.softmax_backward(in[1], y)};
  };
  c.gradient = [view, transposed](Backend& b, Tensors& in, const Tensor& g) {
    const Tensor grad = b.softmax_backward(g, b.softmax(view(in[0])));
    return Tensors{transposed ? grad.permute({1, 0}) : grad};
  };
  c.differentiable = {0};
  c.device_dtypes = {DType::f32, DType::bf16, DType::f16};
  return c;
}

// Inputs: x, dy. Outputs: gelu(x) and its gradient for dy.
OpCase gelu_case(UnaryOp op) {
  OpCase c;
  c.name = std::string(op == UnaryOp::gelu_erf ? "gelu erf form" : "gelu tanh form") +
           " and its backward over [-5, 5]";
  c.inputs = {uniform({3, 41}, -5.0, 5.0), uniform({3, 41})};
  c.run = [op](Backend& b, Tensors& in) {
    const Tensor y = b.unary(op, in[0]);
    return Tensors{y, b.unary_backward(op, in[1], in[0], y)};
  };
  c.gradient = [op](Backend& b, Tensors& in, const Tensor& g) {
    return Tensors{b.unary_backward(op, g, in[0], b.unary(op, in[0]))};
  };
  c.differentiable = {0};
  c.device_dtypes = {DType::f32, DType::bf16, DType::f16};
  return c;
}

struct AttentionSetup {
  int64_t b, h, t, s, d, dv;
  bool packed;    // q, k, v are views of one qkv [B, T, 3, H, d] input (s == t, dv == d), as in a ViT
  bool gradient;  // checked against finite differences too (small shapes only)
};

// out = attention(q, k, v) and its gradients for dy, as nn/functional/attention.cpp runs them: the
// backend's fused kernels where it has them, the composed form otherwise (the backend's backward is
// asked all the same, and declines a forward it did not run).
Tensors attention_and_gradients(Backend& b, const Tensors& qkv, const Tensor& dy) {
  const Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const std::optional<AttentionForward> fused = b.fused_attention(q, k, v, scale);
  const AttentionForward f =
      fused ? *fused : AttentionForward{composed_attention(b, q, k, v, scale), Tensor()};
  std::optional<AttentionGrads> g = b.fused_attention_backward(dy, q, k, v, f.out, f.stats, scale);
  if (!g) g = composed_attention_backward(b, dy, q, k, v, scale);
  return {f.out, g->grad_q, g->grad_k, g->grad_v};
}

// Inputs: qkv (packed) or q, k, v; then dy [B, T, H, dv], read through a permuted view (the layout the
// out-projection hands back). Outputs: out, then the gradients of q, k and v for dy.
OpCase attention_case(const std::string& what, const AttentionSetup& s) {
  OpCase c;
  c.name = "fused_attention and fused_attention_backward " + what;
  if (s.packed)
    c.inputs = {uniform({s.b, s.t, 3, s.h, s.d}, -2.0, 2.0)};
  else
    c.inputs = {uniform({s.b, s.h, s.t, s.d}, -2.0, 2.0), uniform({s.b, s.h, s.s, s.d}, -2.0, 2.0),
                uniform({s.b, s.h, s.s, s.dv})};
  c.inputs.push_back(uniform({s.b, s.t, s.h, s.dv}));  // dy
  auto views = [s](const Tensors& in) {
    if (!s.packed) return Tensors{in[0], in[1], in[2]};
    return Tensors{packed_attention_head(in[0], 0), packed_attention_head(in[0], 1),
                   packed_attention_head(in[0], 2)};
  };
  c.run = [views](Backend& b, Tensors& in) {
    return attention_and_gradients(b, views(in), in.back().permute({0, 2, 1, 3}));
  };
  if (s.gradient)
    c.gradient = [views, s](Backend& b, Tensors& in, const Tensor& seed) {
      const Tensors r = attention_and_gradients(b, views(in), seed);
      if (!s.packed) return Tensors{r[1], r[2], r[3]};
      Tensor packed = Tensor::empty(in[0].shape(), r[1].dtype(), r[1].device());
      for (int which = 0; which < 3; ++which) packed_attention_head(packed, which).copy_(r[1 + which]);
      return Tensors{packed};
    };
  c.differentiable = s.packed ? std::vector<int>{0} : std::vector<int>{0, 1, 2};
  c.device_dtypes = {DType::f32, DType::bf16, DType::f16};
  c.rtol_f32 = 1e-4;
  return c;
}

// ConvNeXt's block end, y = x + h * scale[c] * keep[n] over an NHWC [N, H, W, C] view: the backend's
// fused kernels where it has them, composed of binary ops otherwise (the CPU, the reference).
// Inputs: x, h, scale, [keep,] dy. Outputs: y, then grad_h and grad_scale for dy. f32_scale: the scale
// stays f32 whatever the case's dtype, as ConvNeXt's master weight beside bf16 activations under
// autocast (the composed form widens or rounds it to h's dtype; grad_scale comes back in f32).
OpCase scaled_residual_case(bool with_keep, bool f32_scale = false) {
  OpCase c;
  c.name = std::string("scaled_residual_add and its backward, 2x3x5x40") +
           (with_keep ? " with drop path" : "") + (f32_scale ? ", an f32 scale" : "");
  const Shape shape{2, 3, 5, 40};
  InputSpec scale_spec = uniform({40}, 0.5, 1.5);
  if (f32_scale) scale_spec.fixed_dtype = DType::f32;
  c.inputs = {uniform(shape), uniform(shape), scale_spec};
  if (with_keep) c.inputs.push_back(uniform({2}, 0.5, 2.0));
  c.inputs.push_back(uniform(shape));  // dy
  auto keep_of = [with_keep](Tensors& in) { return with_keep ? in[3] : Tensor(); };
  auto forward = [keep_of](Backend& b, Tensors& in) {
    const Tensor keep = keep_of(in);
    if (auto y = b.scaled_residual_add(in[0], in[1], in[2], keep)) return *y;
    Tensor branch = b.binary(BinaryOp::mul, in[1], in[2].to(in[1].dtype()));
    if (keep.defined()) branch = b.binary(BinaryOp::mul, branch, keep.reshape({2, 1, 1, 1}));
    return b.binary(BinaryOp::add, in[0], branch);
  };
  auto backward = [keep_of](Backend& b, Tensors& in, const Tensor& dy) {
    const Tensor keep = keep_of(in);
    if (auto g = b.scaled_residual_add_backward(dy, in[1], in[2], keep))
      return Tensors{dy, g->first, g->second};
    Tensor gk = keep.defined() ? b.binary(BinaryOp::mul, dy, keep.reshape({2, 1, 1, 1})) : dy;
    return Tensors{dy, b.binary(BinaryOp::mul, gk, in[2].to(in[1].dtype())),
                   b.sum(b.binary(BinaryOp::mul, gk, in[1]), {0, 1, 2}, false).to(in[2].dtype())};
  };
  c.run = [forward, backward](Backend& b, Tensors& in) {
    Tensors out{forward(b, in)};
    const Tensors g = backward(b, in, in.back());
    out.push_back(g[1]);
    out.push_back(g[2]);
    return out;
  };
  c.gradient = [backward, f32_scale](Backend& b, Tensors& in, const Tensor& g) {
    Tensors grads = backward(b, in, g);
    if (f32_scale) grads.pop_back();  // an f32 input is not differentiated in f64
    return grads;
  };
  c.differentiable = f32_scale ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2};
  c.device_dtypes = {DType::f32, DType::bf16};
  c.rtol_f32 = 2e-5;
  return c;
}

struct AddLayerNormSetup {
  Shape x;  // [..., C]
  // The branch is bf16 beside an f32 x, and y is stored as bf16 (autocast's residual stream): the
  // device runs in f32 only, and the f64 reference widens the same bf16 values.
  bool half_branch = false;
  // Whether h has another consumer whose gradient the backward adds (a block's join, not the last).
  bool grad_h_in = true;
};

// Inputs: x, branch, gamma, beta, dy[, dh]. Outputs: y, h, mean, rstd, then the gradients of x, branch,
// gamma and beta for dy (and dh). The finite differences differentiate y (the first output) alone.
OpCase add_layer_norm_case(const std::string& what, const AddLayerNormSetup& s) {
  OpCase c;
  c.name = "add_layer_norm and its backward " + what;
  const int64_t C = s.x.back();
  c.inputs = {uniform(s.x, -2.0, 3.0),
              s.half_branch ? fixed(s.x, DType::bf16, InputSpec::Values::uniform) : uniform(s.x),
              uniform({C}, 0.5, 1.5), uniform({C}), uniform(s.x)};
  if (s.grad_h_in) c.inputs.push_back(uniform(s.x));
  auto branch_of = [](const Tensors& in) {
    return in[0].dtype() == DType::f32 || in[1].dtype() == in[0].dtype() ? in[1] : in[1].to(in[0].dtype());
  };
  auto forward = [C, branch_of](Backend& b, Tensors& in) {
    const Tensor branch = branch_of(in);
    const DType y_dtype = branch.dtype();
    if (auto f = b.add_layer_norm(in[0], branch, C, in[2], in[3], kEps, y_dtype)) return *f;
    const Tensor h = b.binary(BinaryOp::add, in[0], branch);
    const LayerNormForward l = b.layer_norm(h, C, in[2], in[3], kEps, y_dtype);
    return AddLayerNormForward{h, l.y, l.mean, l.rstd};
  };
  auto backward = [branch_of](Backend& b, Tensors& in, const AddLayerNormForward& f, const Tensor& dy,
                              const Tensor& dh) {
    const DType branch_dtype = branch_of(in).dtype();
    const Tensor grad_y = dy.to(f.y.dtype());
    if (auto g = b.add_layer_norm_backward(grad_y, dh, f.h, f.mean, f.rstd, in[2], branch_dtype))
      return Tensors{g->grad_x, g->grad_branch, g->grad_gamma, g->grad_beta};
    const LayerNormGrads l = b.layer_norm_backward(grad_y, f.h, f.mean, f.rstd, in[2]);
    const Tensor grad_h = dh.defined() ? b.binary(BinaryOp::add, dh, l.grad_x) : l.grad_x;
    return Tensors{grad_h, grad_h.to(branch_dtype), l.grad_gamma, l.grad_beta};
  };
  const bool has_dh = s.grad_h_in;
  c.run = [forward, backward, has_dh](Backend& b, Tensors& in) {
    const AddLayerNormForward f = forward(b, in);
    Tensors out{f.y, f.h, f.mean, f.rstd};
    for (const Tensor& g : backward(b, in, f, in[4], has_dh ? in[5] : Tensor())) out.push_back(g);
    return out;
  };
  c.gradient = [forward, backward, half = s.half_branch](Backend& b, Tensors& in, const Tensor& g) {
    Tensors grads = backward(b, in, forward(b, in), g, Tensor());
    if (half) grads.erase(grads.begin() + 1);  // a fixed-dtype input is not differentiated in f64
    return grads;
  };
  c.differentiable = s.half_branch ? std::vector<int>{0, 2, 3} : std::vector<int>{0, 1, 2, 3};
  c.device_dtypes =
      s.half_branch ? std::vector<DType>{DType::f32} : std::vector<DType>{DType::f32, DType::bf16};
  c.rtol_f32 = s.half_branch ? 8e-3 : 2e-5;  // y, dy and the branch's gradient are bf16 on the device
  return c;
}

}  // namespace

std::vector<OpCase> transformer_cases() {
  std::vector<OpCase> cases;
  cases.push_back(layer_norm_case("over the last dim of 3x5x37", {.x = {3, 5, 37}, .normalized_size = 37}));
  cases.push_back(layer_norm_case("over the last dim of 2x384", {.x = {2, 384}, .normalized_size = 384}));
  // Rows longer than a block's threads: several values per thread on the GPU.
  cases.push_back(layer_norm_case("over the last dim of 3x1500", {.x = {3, 1500}, .normalized_size = 1500}));
  {
    OpCase c = layer_norm_case("over the last dim of 5x768 stored as bf16 beside an f32 input",
                               {.x = {5, 768}, .normalized_size = 768, .half_output = true});
    c.device_dtypes = {DType::f32};
    c.rtol_f32 = 8e-3;  // y and dy are bf16 on the device, f64 in the reference
    cases.push_back(c);
  }
  cases.push_back(layer_norm_case("without weight and bias, 3x5x37",
                                  {.x = {3, 5, 37}, .normalized_size = 37, .affine = false}));
  cases.push_back(layer_norm_case("over the channels of a channels-last 4x7x3x5",
                                  {.x = {4, 7, 3, 5}, .normalized_size = 7, .over_channels = true}));
  {
    // Rows whose mean is far from zero against their spread: a one-pass E[x^2] - mean^2 would cancel.
    OpCase c = layer_norm_case("of rows around 50, 4x64",
                               {.x = {4, 64}, .normalized_size = 64, .lo = 50.0, .hi = 52.0});
    c.device_dtypes = {DType::f32};  // a half dtype keeps 2 or 3 bits of these values' spread
    c.rtol_f32 = 1e-4;
    cases.push_back(c);
  }
  // Rows that are no multiple of a block's 4 warps nor of 32 values; ViT-S's and ViT-B's widths with
  // autocast's bf16 branch; the encoder's last join (nothing else reads h); rows longer than the fused
  // kernels take (the CUDA backend composes them).
  cases.push_back(add_layer_norm_case("over 3x7x37, gradient from h's other consumer", {.x = {3, 7, 37}}));
  cases.push_back(
      add_layer_norm_case("over 2x5x384, a bf16 branch beside f32", {.x = {2, 5, 384}, .half_branch = true}));
  cases.push_back(add_layer_norm_case("over 3x768, a bf16 branch, h read by nothing else",
                                      {.x = {3, 768}, .half_branch = true, .grad_h_in = false}));
  cases.push_back(add_layer_norm_case("over 2x1100, rows longer than the fused kernels", {.x = {2, 1100}}));
  cases.push_back(scaled_residual_case(false));
  cases.push_back(scaled_residual_case(true));
  cases.push_back(scaled_residual_case(true, true));
  cases.push_back(softmax_case("over the last dim of 3x5x37", {3, 5, 37}, -3.0, 3.0));
  cases.push_back(softmax_case("over the last dim of 2x384", {2, 384}, -3.0, 3.0));
  cases.push_back(softmax_case("over the last dim of 4x1500", {4, 1500}, -3.0, 3.0));
  // exp(200) overflows f32: only the subtracted maximum keeps these finite.
  cases.push_back(softmax_case("of logits in [-100, 200], 4x50", {4, 50}, -100.0, 200.0));
  cases.push_back(softmax_case("of a transposed 37x6 view", {6, 37}, -3.0, 3.0, true));
  cases.push_back(softmax_case("of rows of one, 4x1", {4, 1}, -3.0, 3.0));
  // Odd sequence lengths (no tile of the fused kernels divides them), packed and apart, k/v longer than q.
  cases.push_back(
      attention_case("of a packed qkv, T 17, 2 heads of 8",
                     {.b = 2, .h = 2, .t = 17, .s = 17, .d = 8, .dv = 8, .packed = true, .gradient = true}));
  cases.push_back(
      attention_case("of q, k, v apart, T 9, S 13, d 16, dv 8",
                     {.b = 2, .h = 3, .t = 9, .s = 13, .d = 16, .dv = 8, .packed = false, .gradient = true}));
  cases.push_back(attention_case(
      "of a packed qkv, T 65, 4 heads of 32",
      {.b = 3, .h = 4, .t = 65, .s = 65, .d = 32, .dv = 32, .packed = true, .gradient = false}));
  // ViT-B/16's attention at 224x224: 197 tokens, 12 heads of 64.
  cases.push_back(attention_case(
      "of a packed qkv, ViT-B/16's T 197, 12 heads of 64",
      {.b = 2, .h = 12, .t = 197, .s = 197, .d = 64, .dv = 64, .packed = true, .gradient = false}));
  cases.push_back(gelu_case(UnaryOp::gelu_erf));
  cases.push_back(gelu_case(UnaryOp::gelu_tanh));
  return cases;
}

}  // namespace trainer::op_cases
