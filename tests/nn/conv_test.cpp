// conv2d: the im2col + GEMM kernels against a direct 7-loop convolution (forward and both
// backwards, f64 and f32, including the multi-sample chunk and 1x1 paths), autograd against finite
// differences, layouts and shape errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "nn/backend.h"
#include "nn/functional.h"
#include "tests/nn/gradcheck.h"

namespace trainer {
namespace {

using testing::random_tensor;

Conv2dParams conv_params(int stride_h, int stride_w, int pad_h, int pad_w, int dil_h = 1, int dil_w = 1,
                         int groups = 1) {
  Conv2dParams p;
  p.stride_h = stride_h, p.stride_w = stride_w;
  p.pad_h = pad_h, p.pad_w = pad_w;
  p.dilation_h = dil_h, p.dilation_w = dil_w;
  p.groups = groups;
  return p;
}

// Direct convolution on host vectors; x [N, C, H, W], w [O, C/g, KH, KW] -> y [N, O, OH, OW].
struct NaiveConv {
  Shape x, w;
  Conv2dParams p;
  int64_t oh() const {
    return conv_output_size(x[2], static_cast<int>(w[2]), p.stride_h, p.pad_h, p.dilation_h);
  }
  int64_t ow() const {
    return conv_output_size(x[3], static_cast<int>(w[3]), p.stride_w, p.pad_w, p.dilation_w);
  }
  Shape y() const { return {x[0], w[0], oh(), ow()}; }

  // Calls fn(x_index, w_index, y_index) for every multiply-add of the convolution.
  template <class Fn>
  void for_each_tap(Fn&& fn) const {
    const int64_t n_ = x[0], c_ = x[1], h_ = x[2], w_ = x[3], o_ = w[0], cg = w[1], kh = w[2], kw = w[3];
    const int64_t og = o_ / p.groups, oh_ = oh(), ow_ = ow();
    for (int64_t n = 0; n < n_; ++n)
      for (int64_t o = 0; o < o_; ++o)
        for (int64_t i = 0; i < oh_; ++i)
          for (int64_t j = 0; j < ow_; ++j)
            for (int64_t c = 0; c < cg; ++c)
              for (int64_t ki = 0; ki < kh; ++ki)
                for (int64_t kj = 0; kj < kw; ++kj) {
                  const int64_t ih = i * p.stride_h - p.pad_h + ki * p.dilation_h;
                  const int64_t iw = j * p.stride_w - p.pad_w + kj * p.dilation_w;
                  if (ih < 0 || ih >= h_ || iw < 0 || iw >= w_) continue;
                  const int64_t ci = (o / og) * cg + c;
                  fn(((n * c_ + ci) * h_ + ih) * w_ + iw, ((o * cg + c) * kh + ki) * kw + kj,
                     ((n * o_ + o) * oh_ + i) * ow_ + j);
                }
  }

  std::vector<double> forward(const std::vector<double>& xv, const std::vector<double>& wv,
                              const std::vector<double>* bias) const {
    const Shape ys = y();
    std::vector<double> out(static_cast<size_t>(shape_numel(ys)), 0.0);
    if (bias)
      for (size_t i = 0; i < out.size(); ++i) out[i] = (*bias)[(i / (ys[2] * ys[3])) % ys[1]];
    for_each_tap([&](int64_t xi, int64_t wi, int64_t yi) { out[yi] += xv[xi] * wv[wi]; });
    return out;
  }
  std::vector<double> backward_input(const std::vector<double>& dy, const std::vector<double>& wv) const {
    std::vector<double> dx(static_cast<size_t>(shape_numel(x)), 0.0);
    for_each_tap([&](int64_t xi, int64_t wi, int64_t yi) { dx[xi] += dy[yi] * wv[wi]; });
    return dx;
  }
  std::vector<double> backward_weight(const std::vector<double>& dy, const std::vector<double>& xv) const {
    std::vector<double> dw(static_cast<size_t>(shape_numel(w)), 0.0);
    for_each_tap([&](int64_t xi, int64_t wi, int64_t yi) { dw[wi] += dy[yi] * xv[xi]; });
    return dw;
  }
};

void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i]));
    if (err > worst) worst = err, at = i;
  }
  EXPECT_LT(worst, tol) << what << ": element " << at << " got " << got[at] << " want " << want[at];
}

struct ConvCase {
  const char* name;
  Shape x, w;
  Conv2dParams p;
  bool bias;
};

// Cases for the kernel-vs-naive comparison. Output planes >= 512 run one sample per GEMM; smaller
// ones batch samples, with a ragged last chunk where N is not a multiple of the chunk.
std::vector<ConvCase> kernel_cases() {
  return {
      {"3x3 pad 1", {2, 3, 7, 6}, {4, 3, 3, 3}, conv_params(1, 1, 1, 1), true},
      {"stride 2 pad 1", {3, 4, 9, 8}, {6, 4, 3, 3}, conv_params(2, 2, 1, 1), true},
      {"asymmetric stride/pad, 2x3 kernel", {2, 3, 8, 9}, {5, 3, 2, 3}, conv_params(2, 1, 0, 2), false},
      {"dilation 2", {2, 2, 9, 9}, {3, 2, 3, 3}, conv_params(1, 1, 2, 2, 2, 2), true},
      {"dilation (2, 1), stride 3", {2, 2, 11, 10}, {3, 2, 3, 2}, conv_params(3, 2, 1, 0, 2, 1), false},
      {"groups 2", {2, 4, 6, 6}, {6, 2, 3, 3}, conv_params(1, 1, 1, 1, 1, 1, 2), true},
      {"depthwise", {3, 4, 7, 7}, {8, 1, 3, 3}, conv_params(2, 2, 1, 1, 1, 1, 4), true},
      {"1x1", {3, 5, 4, 4}, {7, 5, 1, 1}, conv_params(1, 1, 0, 0), true},
      {"1x1 one sample", {1, 5, 4, 4}, {7, 5, 1, 1}, conv_params(1, 1, 0, 0), false},
      {"1x1 large plane", {2, 3, 24, 24}, {4, 3, 1, 1}, conv_params(1, 1, 0, 0), true},
      {"1x1 stride 2", {2, 6, 7, 7}, {4, 6, 1, 1}, conv_params(2, 2, 0, 0), false},
      {"1x1 groups 2", {2, 4, 5, 5}, {6, 2, 1, 1}, conv_params(1, 1, 0, 0, 1, 1, 2), true},
      {"large plane, one sample per GEMM", {2, 3, 26, 25}, {4, 3, 3, 3}, conv_params(1, 1, 1, 1), true},
      {"ragged chunk", {3, 2, 18, 18}, {3, 2, 3, 3}, conv_params(1, 1, 1, 1), true},
      {"kernel covers the padded input", {2, 2, 3, 3}, {3, 2, 5, 5}, conv_params(1, 1, 1, 1), true},
      {"padding wider than the input", {1, 1, 2, 2}, {2, 1, 3, 3}, conv_params(1, 1, 3, 3), false},
  };
}

TEST(Conv, KernelsMatchNaiveF64) {
  Generator gen(1);
  Backend& k = cpu_backend();
  for (const ConvCase& c : kernel_cases()) {
    const NaiveConv naive{c.x, c.w, c.p};
    const Tensor x = random_tensor(c.x, gen), w = random_tensor(c.w, gen);
    const Tensor b = c.bias ? random_tensor({c.w[0]}, gen) : Tensor();
    const std::vector<double> bv = c.bias ? b.to_vector<double>() : std::vector<double>();
    const Tensor y = k.conv2d(x, w, b, c.p);
    ASSERT_EQ(y.shape(), naive.y()) << c.name;
    EXPECT_TRUE(y.is_contiguous()) << c.name;
    expect_near(y.to_vector<double>(),
                naive.forward(x.to_vector<double>(), w.to_vector<double>(), c.bias ? &bv : nullptr), 1e-12,
                std::string(c.name) + " forward");

    const Tensor dy = random_tensor(naive.y(), gen);
    expect_near(k.conv2d_backward_input(dy, w, c.x, c.p).to_vector<double>(),
                naive.backward_input(dy.to_vector<double>(), w.to_vector<double>()), 1e-12,
                std::string(c.name) + " backward input");
    expect_near(k.conv2d_backward_weight(dy, x, c.w, c.p).to_vector<double>(),
                naive.backward_weight(dy.to_vector<double>(), x.to_vector<double>()), 1e-12,
                std::string(c.name) + " backward weight");
  }
}

TEST(Conv, KernelsMatchNaiveF32) {
  Generator gen(2);
  Backend& k = cpu_backend();
  for (const ConvCase& c : kernel_cases()) {
    const NaiveConv naive{c.x, c.w, c.p};
    const Tensor x = random_tensor(c.x, gen), w = random_tensor(c.w, gen), b = random_tensor({c.w[0]}, gen);
    const std::vector<double> bv = b.to_vector<double>();
    const Tensor y = k.conv2d(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32), c.p);
    ASSERT_EQ(y.dtype(), DType::f32);
    expect_near(y.to_vector<double>(), naive.forward(x.to_vector<double>(), w.to_vector<double>(), &bv), 1e-5,
                std::string(c.name) + " f32 forward");
    const Tensor dy = random_tensor(naive.y(), gen);
    expect_near(k.conv2d_backward_input(dy.to(DType::f32), w.to(DType::f32), c.x, c.p).to_vector<double>(),
                naive.backward_input(dy.to_vector<double>(), w.to_vector<double>()), 1e-5,
                std::string(c.name) + " f32 backward input");
    expect_near(k.conv2d_backward_weight(dy.to(DType::f32), x.to(DType::f32), c.w, c.p).to_vector<double>(),
                naive.backward_weight(dy.to_vector<double>(), x.to_vector<double>()), 1e-5,
                std::string(c.name) + " f32 backward weight");
  }
}

TEST(Conv, AnyInputLayoutGivesTheSameResult) {
  Generator gen(3);
  Backend& k = cpu_backend();
  const Conv2dParams p = conv_params(2, 1, 1, 0);
  const Tensor x = random_tensor({2, 3, 6, 5}, gen), w = random_tensor({4, 3, 3, 2}, gen);
  const Tensor dy = random_tensor({2, 4, 3, 4}, gen);
  const Tensor y = k.conv2d(x, w, Tensor(), p);
  const Tensor x_cl = x.contiguous(MemoryFormat::channels_last);
  const Tensor w_cl = w.contiguous(MemoryFormat::channels_last);
  const Tensor dy_cl = dy.contiguous(MemoryFormat::channels_last);
  ASSERT_FALSE(x_cl.is_contiguous());
  EXPECT_EQ(k.conv2d(x_cl, w_cl, Tensor(), p).to_vector<double>(), y.to_vector<double>());
  EXPECT_EQ(k.conv2d_backward_input(dy_cl, w_cl, x.shape(), p).to_vector<double>(),
            k.conv2d_backward_input(dy, w, x.shape(), p).to_vector<double>());
  EXPECT_EQ(k.conv2d_backward_weight(dy_cl, x_cl, w.shape(), p).to_vector<double>(),
            k.conv2d_backward_weight(dy, x, w.shape(), p).to_vector<double>());
}

// ---- gradient checks through autograd, f64

struct GradCase {
  Shape x, w;
  Conv2dParams p;
  bool bias;
};

void conv_gradcheck(const GradCase& c, uint64_t seed) {
  Generator gen(seed);
  std::vector<Variable> inputs{Variable(random_tensor(c.x, gen), true),
                               Variable(random_tensor(c.w, gen), true)};
  if (c.bias) inputs.emplace_back(random_tensor({c.w[0]}, gen), true);
  const Conv2dParams p = c.p;
  EXPECT_GRADCHECK(
      [p](const std::vector<Variable>& v) {
        return F::conv2d(v[0], v[1], v.size() > 2 ? v[2] : Variable(), p);
      },
      inputs);
}

TEST(ConvGrad, Stride2Padding) {
  conv_gradcheck({{2, 3, 7, 6}, {4, 3, 3, 3}, conv_params(2, 2, 1, 1), true}, 11);
}
TEST(ConvGrad, NoBias) { conv_gradcheck({{2, 2, 5, 5}, {3, 2, 3, 3}, conv_params(1, 1, 1, 1), false}, 12); }
TEST(ConvGrad, Dilation2) {
  conv_gradcheck({{1, 2, 8, 7}, {3, 2, 3, 3}, conv_params(1, 1, 2, 1, 2, 2), true}, 13);
}
TEST(ConvGrad, Groups2) {
  conv_gradcheck({{2, 4, 5, 5}, {6, 2, 3, 3}, conv_params(1, 1, 1, 1, 1, 1, 2), true}, 14);
}
TEST(ConvGrad, Depthwise) {
  conv_gradcheck({{2, 3, 6, 6}, {3, 1, 3, 3}, conv_params(2, 2, 1, 1, 1, 1, 3), true}, 15);
}
TEST(ConvGrad, NonSquareKernelAndStride) {
  conv_gradcheck({{2, 2, 7, 8}, {3, 2, 2, 3}, conv_params(2, 1, 1, 0), false}, 16);
}
TEST(ConvGrad, Pointwise) { conv_gradcheck({{2, 3, 4, 4}, {5, 3, 1, 1}, conv_params(1, 1, 0, 0), true}, 17); }
TEST(ConvGrad, PointwiseOneSample) {
  conv_gradcheck({{1, 3, 4, 5}, {2, 3, 1, 1}, conv_params(1, 1, 0, 0), false}, 18);
}
TEST(ConvGrad, PointwiseStride2) {
  conv_gradcheck({{2, 3, 5, 5}, {2, 3, 1, 1}, conv_params(2, 2, 0, 0), true}, 19);
}

TEST(ConvGrad, InputWithoutGradientGetsNone) {
  Generator gen(20);
  Variable x(random_tensor({2, 2, 5, 5}, gen), false);
  Variable w(random_tensor({3, 2, 3, 3}, gen), true);
  Variable b(random_tensor({3}, gen), true);
  F::sum(F::conv2d(x, w, b, conv_params(1, 1, 1, 1))).backward();
  EXPECT_FALSE(x.grad().defined());
  ASSERT_TRUE(w.grad().defined());
  ASSERT_TRUE(b.grad().defined());
  EXPECT_NEAR(b.grad().to_vector<double>()[0], 2 * 5 * 5, 1e-12);  // d sum / d bias = N * OH * OW
  // Only the input wants a gradient: conv2d still backpropagates into it.
  Variable x2(random_tensor({2, 2, 5, 5}, gen), true);
  Variable w2(random_tensor({3, 2, 3, 3}, gen), false);
  F::sum(F::conv2d(x2, w2, Variable(), conv_params(1, 1, 1, 1))).backward();
  EXPECT_TRUE(x2.grad().defined());
  EXPECT_FALSE(w2.grad().defined());
}

// ---- errors name the shapes

void expect_invalid(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "expected std::invalid_argument mentioning '" << fragment << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Conv, ShapeErrors) {
  Backend& k = cpu_backend();
  const Tensor x = Tensor::zeros({2, 4, 5, 5}, DType::f64);
  expect_invalid(
      [&] {
        k.conv2d(x, Tensor::zeros({3, 3, 3, 3}, DType::f64), Tensor(), Conv2dParams{});
      },
      "[3, 3, 3, 3]");
  expect_invalid(
      [&] {
        k.conv2d(Tensor::zeros({4, 5, 5}, DType::f64), Tensor::zeros({3, 4, 3, 3}, DType::f64), Tensor(),
                 Conv2dParams{});
      },
      "[4, 5, 5]");
  Conv2dParams g3;
  g3.groups = 3;
  expect_invalid([&] { k.conv2d(x, Tensor::zeros({3, 1, 3, 3}, DType::f64), Tensor(), g3); }, "groups");
  expect_invalid(
      [&] {
        k.conv2d(x, Tensor::zeros({3, 4, 7, 7}, DType::f64), Tensor(), Conv2dParams{});
      },
      "[2, 4, 5, 5]");
  // (4 - 5) / 3 truncates to 0: the kernel must be checked against the input, not only the output size.
  expect_invalid(
      [&] {
        k.conv2d(Tensor::zeros({1, 1, 4, 4}, DType::f64), Tensor::zeros({1, 1, 5, 5}, DType::f64), Tensor(),
                 conv_params(3, 3, 0, 0));
      },
      "larger than the padded input");
  expect_invalid(
      [&] {
        k.conv2d(x, Tensor::zeros({3, 4, 3, 3}, DType::f64), Tensor::zeros({4}, DType::f64), Conv2dParams{});
      },
      "bias has shape [4]");
  expect_invalid(
      [&] {
        k.conv2d(x, Tensor::zeros({3, 4, 3, 3}, DType::f32), Tensor(), Conv2dParams{});
      },
      "f32");
  expect_invalid(
      [&] {
        k.conv2d_backward_input(Tensor::zeros({2, 3, 4, 4}, DType::f64),
                                Tensor::zeros({3, 4, 3, 3}, DType::f64), x.shape(), Conv2dParams{});
      },
      "[2, 3, 3, 3]");
  expect_invalid(
      [&] {
        k.conv2d_backward_weight(Tensor::zeros({2, 3, 4, 4}, DType::f64), x, {3, 4, 3, 3}, Conv2dParams{});
      },
      "grad_y has shape [2, 3, 4, 4]");
}

}  // namespace
}  // namespace trainer
