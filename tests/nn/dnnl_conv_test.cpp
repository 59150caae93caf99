// The oneDNN convolutions (nn/cpu/dnnl_conv.h) against the im2col path in f64 (which conv_test.cpp
// checks against a direct convolution): forward and both gradients, NCHW and channels-last, with
// stride 2, padding, 1x1, dilation and groups. Then the blocked copies the convolutions keep between
// calls (nn/cpu/dnnl_blocked_copies.h: x from the forward and grad_y from the data gradient, for the
// weight gradient) against im2col where a stale copy would give other numbers: an input written in
// place and run forward again, a weight changed by an SGD step, a new tensor at a freed tensor's
// address, another grad_y. Skipped in a build without oneDNN.
#include "nn/cpu/dnnl_conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nn/backend.h"
#include "nn/functional.h"
#include "tests/nn/gradcheck.h"

#ifdef TRAINER_WITH_DNNL
#include "nn/cpu/dnnl_blocked_copies.h"
#endif

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

// ---- blocked copies kept between calls

Backend& k() { return cpu_backend(); }

// Shapes that oneDNN runs on its blocked layout with reorders on both sides (16 channels).
const Shape kX{2, 16, 8, 8}, kW{16, 16, 3, 3};

Conv2dParams pad1() {
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  return p;
}

class DnnlBlockedCopies : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef TRAINER_WITH_DNNL
    GTEST_SKIP() << "built without oneDNN";
#endif
  }
};

#ifdef TRAINER_WITH_DNNL
// The cache itself: found by the source's identity and the layout, handed over once, never for a
// view with other strides or offset, and forgotten when the source is freed.
TEST_F(DnnlBlockedCopies, KeepAndTake) {
  using dnnl::memory;
  const memory::desc blocked({2, 16, 4, 4}, memory::data_type::f32, memory::format_tag::nChw16c);
  const memory::desc other({2, 16, 4, 4}, memory::data_type::f32, memory::format_tag::nChw8c);
  BlockedCopies copies;
  const Tensor source = Tensor::zeros({2, 16, 4, 4}), copy = Tensor::zeros({512});
  copies.keep(source, blocked, copy);
  EXPECT_FALSE(copies.take(source, other).defined()) << "another layout";
  EXPECT_FALSE(copies.take(source.clone(), blocked).defined()) << "another tensor with the same values";
  EXPECT_FALSE(copies.take(source.slice(0, 1, 2), blocked).defined()) << "a view of the source";
  const Tensor same_view = source.slice(0, 0, 2);
  EXPECT_TRUE(copies.take(same_view, blocked).same_storage(copy)) << "the same elements";
  EXPECT_FALSE(copies.take(source, blocked).defined()) << "handed over once";
  {
    const Tensor gone = Tensor::zeros({2, 16, 4, 4});
    copies.keep(gone, blocked, Tensor::zeros({512}));
  }
  copies.keep(source, blocked, copy);  // drops the entry of the freed tensor
  EXPECT_EQ(copies.size(), 1u);
}
#endif

// A forward, the input written in place, a second forward: the weight gradient uses the new values.
TEST_F(DnnlBlockedCopies, InputWrittenInPlaceIsReorderedAgainByTheNextForward) {
  Generator gen(31);
  const Tensor x64a = random_tensor(kX, gen), x64b = random_tensor(kX, gen), w64 = random_tensor(kW, gen);
  const Tensor w = w64.to(DType::f32);
  Tensor x = x64a.to(DType::f32);
  const Tensor y = k().conv2d(x, w, Tensor(), pad1());
  const Tensor dy64 = random_tensor(y.shape(), gen), dy = dy64.to(DType::f32);
  x.copy_(x64b);  // a loader reusing its batch buffer
  k().conv2d(x, w, Tensor(), pad1());
  expect_close(k().conv2d_backward_weight(dy, x, kW, pad1()),
               k().conv2d_backward_weight(dy64, x64b, kW, pad1()),
               "weight gradient after the second forward");
}

// Hands out the same block for every allocation: a new tensor at a freed tensor's address, every time.
class OneBlockAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override { return nbytes <= sizeof(block_) ? block_ : nullptr; }
  void deallocate(void*, size_t) override {}

 private:
  alignas(64) unsigned char block_[2 * 16 * 8 * 8 * 4];
};

// A copy whose source was freed is never used for a new tensor, even at the same address.
TEST_F(DnnlBlockedCopies, FreedInputsCopyIsNotUsedForANewTensorAtItsAddress) {
  Generator gen(32);
  OneBlockAllocator one_block;
  const Tensor w = random_tensor(kW, gen).to(DType::f32);
  const Tensor dy64 = random_tensor(kX, gen), dy = dy64.to(DType::f32);
  const Tensor x64a = random_tensor(kX, gen), x64b = random_tensor(kX, gen);
  {
    Tensor x = Tensor::empty_from(one_block, kX, DType::f32);
    x.copy_(x64a);
    k().conv2d(x, w, Tensor(), pad1());
  }
  Tensor x = Tensor::empty_from(one_block, kX, DType::f32);
  x.copy_(x64b);
  expect_close(k().conv2d_backward_weight(dy, x, kW, pad1()),
               k().conv2d_backward_weight(dy64, x64b, kW, pad1()), "weight gradient of a new tensor");
}

// grad_y's copy from the data gradient serves only a weight gradient of the same grad_y.
TEST_F(DnnlBlockedCopies, GradOutputCopyServesOnlyTheSameGradOutput) {
  Generator gen(33);
  const Tensor x64 = random_tensor(kX, gen), w64 = random_tensor(kW, gen);
  const Tensor x = x64.to(DType::f32), w = w64.to(DType::f32);
  const Tensor dy64a = random_tensor(kX, gen), dy64b = random_tensor(kX, gen);
  const Tensor dya = dy64a.to(DType::f32), dyb = dy64b.to(DType::f32);
  k().conv2d_backward_input(dya, w, kX, pad1());
  expect_close(k().conv2d_backward_weight(dyb, x, kW, pad1()),
               k().conv2d_backward_weight(dy64b, x64, kW, pad1()), "weight gradient of another grad_y");
  k().conv2d_backward_input(dya, w, kX, pad1());
  expect_close(k().conv2d_backward_weight(dya, x, kW, pad1()),
               k().conv2d_backward_weight(dy64a, x64, kW, pad1()), "weight gradient of the same grad_y");
  // Used once: a second weight gradient of the same grad_y reorders it again, with the same result.
  expect_close(k().conv2d_backward_weight(dya, x, kW, pad1()),
               k().conv2d_backward_weight(dy64a, x64, kW, pad1()),
               "second weight gradient of the same grad_y");
}

// Two training steps through autograd, the weight updated by SGD in place between them and the input
// batch written into the same buffer: both steps' gradients match im2col in f64.
TEST_F(DnnlBlockedCopies, SecondStepAfterAnSgdUpdateMatchesIm2col) {
  Generator gen(34);
  Tensor x64 = random_tensor(kX, gen), w64 = random_tensor(kW, gen);
  Variable x(x64.to(DType::f32), true), w(w64.to(DType::f32), true);
  for (int step = 0; step < 2; ++step) {
    const Tensor r64 = random_tensor(kX, gen);
    x.zero_grad();
    w.zero_grad();
    F::sum(F::mul(F::conv2d(x, w, Variable(), pad1()), Variable(r64.to(DType::f32)))).backward();
    const std::string s = "step " + std::to_string(step);
    expect_close(w.grad(), k().conv2d_backward_weight(r64, x64, kW, pad1()), s + " weight gradient");
    expect_close(x.grad(), k().conv2d_backward_input(r64, w64, kX, pad1()), s + " input gradient");
    // SGD, lr 0.5: w -= 0.5 * grad, in place in both precisions; the next batch into x's buffer.
    const std::vector<double> wv = w.data().to_vector<double>(), gv = w.grad().to_vector<double>();
    std::vector<double> next(wv.size());
    for (size_t i = 0; i < wv.size(); ++i) next[i] = wv[i] - 0.5 * gv[i];
    w64 = Tensor::from_vector(next, kW);
    w.data().copy_(w64);
    w64 = w.data().to(DType::f64);  // the f32 weight exactly
    x64 = random_tensor(kX, gen);
    x.data().copy_(x64);
  }
}

}  // namespace
}  // namespace trainer
