// The oneDNN convolutions (nn/cpu/dnnl_conv.h) against the im2col path in f64 (which conv_test.cpp
// checks against a direct convolution): forward and both gradients, NCHW and channels-last, with
// stride 2, padding, 1x1, dilation and groups. Skipped in a build without oneDNN.
#include "nn/cpu/dnnl_conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nn/backend.h"
#include "tests/nn/gradcheck.h"

namespace trainer {
namespace {

using testing::random_tensor;

struct Case {
  const char* name;
  Shape x, w;
  int stride, pad, dilation, groups;
  bool bias;
};

std::vector<Case> cases() {
  return {
      {"3x3 pad 1", {2, 8, 9, 9}, {16, 8, 3, 3}, 1, 1, 1, 1, false},
      {"3x3 pad 1, bias", {3, 4, 7, 6}, {8, 4, 3, 3}, 1, 1, 1, 1, true},
      {"3x3 stride 2 pad 1", {2, 16, 8, 8}, {32, 16, 3, 3}, 2, 1, 1, 1, false},
      {"3x3 stride 2, odd input", {2, 16, 9, 9}, {32, 16, 3, 3}, 2, 1, 1, 1, false},
      {"1x1", {2, 32, 4, 4}, {16, 32, 1, 1}, 1, 0, 1, 1, false},
      {"1x1 stride 2 (ResNet shortcut)", {2, 16, 8, 8}, {32, 16, 1, 1}, 2, 0, 1, 1, false},
      {"1x1 stride 2, odd input", {2, 16, 7, 7}, {32, 16, 1, 1}, 2, 0, 1, 1, false},
      {"RGB stem", {2, 3, 12, 12}, {16, 3, 3, 3}, 1, 1, 1, 1, false},
      {"one input channel, bias", {2, 1, 10, 10}, {8, 1, 3, 3}, 1, 1, 1, 1, true},
      {"dilation 2", {2, 8, 9, 9}, {8, 8, 3, 3}, 1, 2, 2, 1, false},
      {"groups 2", {2, 8, 6, 6}, {16, 4, 3, 3}, 1, 1, 1, 2, true},
      {"depthwise", {2, 16, 7, 7}, {16, 1, 3, 3}, 2, 1, 1, 16, false},
      {"late ResNet stage", {4, 64, 2, 2}, {64, 64, 3, 3}, 1, 1, 1, 1, false},
  };
}

Conv2dParams params_of(const Case& c) {
  Conv2dParams p;
  p.stride_h = p.stride_w = c.stride;
  p.pad_h = p.pad_w = c.pad;
  p.dilation_h = p.dilation_w = c.dilation;
  p.groups = c.groups;
  return p;
}

// The largest error relative to max(1, |want|): f32 sums of up to a few hundred products.
void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i)
    worst = std::max(worst, std::abs(g[i] - w[i]) / std::max(1.0, std::abs(w[i])));
  EXPECT_LT(worst, 2e-5) << what;
}

MemoryFormat format_of(bool channels_last) {
  return channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
}

class DnnlConv : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
#ifndef TRAINER_WITH_DNNL
    GTEST_SKIP() << "built without oneDNN";
#endif
  }
};

TEST_P(DnnlConv, ForwardMatchesIm2col) {
  const bool cl = GetParam();
  Generator gen(11);
  for (const Case& c : cases()) {
    const Conv2dParams p = params_of(c);
    const Tensor x = random_tensor(c.x, gen), w = random_tensor(c.w, gen);
    const Tensor b = c.bias ? random_tensor({c.w[0]}, gen) : Tensor();
    const Tensor want = cpu_backend().conv2d(x, w, b, p);  // f64: im2col
    const Tensor xf = x.to(DType::f32).contiguous(format_of(cl));
    const Tensor got = dnnl_conv2d(xf, w.to(DType::f32), c.bias ? b.to(DType::f32) : Tensor(), p);
    ASSERT_TRUE(got.defined()) << c.name << ": oneDNN declined";
    EXPECT_EQ(got.dtype(), DType::f32);
    // One input channel: channels-last is NCHW too, and the tensor says NCHW.
    EXPECT_TRUE(got.is_contiguous(xf.suggest_memory_format()))
        << c.name << ": the output follows the input's layout";
    expect_close(got, want, std::string(c.name) + " forward");
  }
}

TEST_P(DnnlConv, InputGradientMatchesIm2col) {
  const bool cl = GetParam();
  Generator gen(12);
  for (const Case& c : cases()) {
    const Conv2dParams p = params_of(c);
    const Tensor w = random_tensor(c.w, gen);
    const Shape y_shape = cpu_backend().conv2d(Tensor::zeros(c.x, DType::f64), w, Tensor(), p).shape();
    const Tensor dy = random_tensor(y_shape, gen);
    const Tensor want = cpu_backend().conv2d_backward_input(dy, w, c.x, p);
    const Tensor got =
        dnnl_conv2d_backward_input(dy.to(DType::f32).contiguous(format_of(cl)), w.to(DType::f32), c.x, p);
    if (c.x[1] < 4) {  // declined on purpose: im2col measured faster for so few input channels
      EXPECT_FALSE(got.defined()) << c.name;
      continue;
    }
    ASSERT_TRUE(got.defined()) << c.name << ": oneDNN declined";
    EXPECT_TRUE(got.is_contiguous(format_of(cl))) << c.name << ": dx follows grad_y's layout";
    expect_close(got, want, std::string(c.name) + " input gradient");
  }
}

TEST_P(DnnlConv, WeightGradientMatchesIm2col) {
  const bool cl = GetParam();
  Generator gen(13);
  for (const Case& c : cases()) {
    const Conv2dParams p = params_of(c);
    const Tensor x = random_tensor(c.x, gen);
    const Shape y_shape = cpu_backend().conv2d(x, Tensor::zeros(c.w, DType::f64), Tensor(), p).shape();
    const Tensor dy = random_tensor(y_shape, gen);
    const Tensor want = cpu_backend().conv2d_backward_weight(dy, x, c.w, p);
    const Tensor got = dnnl_conv2d_backward_weight(dy.to(DType::f32).contiguous(format_of(cl)),
                                                   x.to(DType::f32).contiguous(format_of(cl)), c.w, p);
    ASSERT_TRUE(got.defined()) << c.name << ": oneDNN declined";
    EXPECT_TRUE(got.is_contiguous()) << c.name;
    expect_close(got, want, std::string(c.name) + " weight gradient");
  }
}

TEST_P(DnnlConv, DeclinesF64) {
  const bool cl = GetParam();
  Generator gen(14);
  const Tensor x = random_tensor({2, 4, 5, 5}, gen).contiguous(format_of(cl));
  const Tensor w = random_tensor({4, 4, 3, 3}, gen);
  EXPECT_FALSE(dnnl_conv2d(x, w, Tensor(), Conv2dParams{}).defined());
}

// The backend's f32 entry points reach oneDNN and agree with it exactly: the same primitive ran.
TEST_P(DnnlConv, BackendUsesIt) {
  const bool cl = GetParam();
  Generator gen(15);
  const Conv2dParams p = params_of(cases()[2]);
  const Tensor x = random_tensor({2, 16, 8, 8}, gen).to(DType::f32).contiguous(format_of(cl));
  const Tensor w = random_tensor({32, 16, 3, 3}, gen).to(DType::f32);
  EXPECT_EQ(cpu_backend().conv2d(x, w, Tensor(), p).to_vector<float>(),
            dnnl_conv2d(x, w, Tensor(), p).to_vector<float>());
}

INSTANTIATE_TEST_SUITE_P(Layouts, DnnlConv, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("ChannelsLast") : std::string("Nchw");
                         });

}  // namespace
}  // namespace trainer
