// nn/cuda/im2col_conv.h: convolutions with few input channels as im2col + GEMM give the CPU
// backend's forward and weight gradient (f32, on the same half-rounded inputs) within half-precision
// rounding, for ResNet-50's and ResNet-18's stems, one channel, dilation, a non-square kernel and
// unequal strides; the output is channels-last and the weight gradient comes back in the format asked.
#include "nn/cuda/im2col_conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/gpu/backend_options.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

struct StemCase {
  Shape x, w;
  Conv2dParams p;
};

Conv2dParams conv(int sh, int sw, int ph, int pw, int dilation = 1) {
  Conv2dParams p;
  p.stride_h = sh, p.stride_w = sw, p.pad_h = ph, p.pad_w = pw, p.dilation_h = dilation,
  p.dilation_w = dilation;
  return p;
}

TEST(Im2colConv, ForcedPathGivesTheCpuConvolutionAndWeightGradient) {
  REQUIRE_GPU();
  testing::set_backend_option(&runtime::BackendOptions::deterministic, false);
  struct Force {
    Force() { testing::set_backend_option(&runtime::BackendOptions::force_im2col_conv, true); }
    ~Force() { testing::set_backend_option(&runtime::BackendOptions::force_im2col_conv, false); }
  } force;
  const std::vector<StemCase> cases = {
      {{4, 3, 32, 32}, {16, 3, 7, 7}, conv(2, 2, 3, 3)},    // ResNet-50's stem: k = 147, padded to 152
      {{5, 3, 17, 19}, {8, 3, 3, 3}, conv(1, 1, 1, 1)},     // ResNet-18-cifar's: k = 27
      {{3, 1, 28, 28}, {16, 1, 3, 3}, conv(1, 1, 1, 1)},    // Fashion-MNIST: k = 9
      {{2, 4, 15, 15}, {8, 4, 3, 3}, conv(1, 1, 2, 2, 2)},  // dilation 2, k = 36
      {{2, 2, 11, 9}, {8, 2, 5, 3}, conv(2, 1, 2, 1)},      // non-square kernel, unequal strides
  };
  Generator gen(70);
  const int64_t calls = cuda::im2col_conv_calls();
  int expected_calls = 0;
  for (DType dtype : {DType::bf16, DType::f16})
    for (const StemCase& c : cases) {
      const std::string what =
          std::string(dtype_name(dtype)) + " x " + shape_str(c.x) + " w " + shape_str(c.w);
      const Tensor x = random(c.x, gen, DType::f32, -2.0, 2.0).to(dtype);
      const Tensor w = random(c.w, gen, DType::f32, -0.5, 0.5).to(dtype);
      const Tensor y_ref = cpu().conv2d(as_f32(x), as_f32(w), Tensor(), c.p);
      const Tensor y = dev().conv2d(on_gpu(x, MemoryFormat::channels_last), on_gpu(w), Tensor(), c.p);
      ++expected_calls;
      EXPECT_TRUE(y.is_contiguous(MemoryFormat::channels_last)) << what;
      expect_near_scale(y_ref, as_f32(y), 1e-2, what + " forward");
      const Tensor dy = random(y_ref.shape(), gen, DType::f32).to(dtype);
      const Tensor dw_ref = cpu().conv2d_backward_weight(as_f32(dy), as_f32(x), c.w, c.p);
      for (MemoryFormat f : {MemoryFormat::channels_last, MemoryFormat::contiguous}) {
        // The weight gradient follows x's format; an NCHW gradient of y is read through its strides.
        const Tensor dw =
            dev().conv2d_backward_weight(on_gpu(dy, f), on_gpu(x, MemoryFormat::channels_last), c.w, c.p);
        ++expected_calls;
        EXPECT_TRUE(dw.is_contiguous(MemoryFormat::channels_last)) << what;
        expect_near_scale(dw_ref, as_f32(dw), 1e-2, what + " weight gradient");
      }
    }
  EXPECT_EQ(cuda::im2col_conv_calls() - calls, expected_calls);
}

// Declined where it does not apply: 5 or more channels, f32, an NCHW input (one channel too), groups,
// train.deterministic.
TEST(Im2colConv, DeclinedOutsideItsCases) {
  REQUIRE_GPU();
  testing::set_backend_option(&runtime::BackendOptions::deterministic, false);
  Generator gen(71);
  const auto ran = [&](const Tensor& x, const Tensor& w, const Conv2dParams& p) {
    testing::set_backend_option(&runtime::BackendOptions::force_im2col_conv, true);
    const int64_t before = cuda::im2col_conv_calls();
    dev().conv2d(x, w, Tensor(), p);
    testing::set_backend_option(&runtime::BackendOptions::force_im2col_conv, false);
    return cuda::im2col_conv_calls() > before;
  };
  const Conv2dParams p = conv(1, 1, 1, 1);
  const auto x_of = [&](int64_t c, DType dtype, MemoryFormat f) {
    return on_gpu(random({2, c, 8, 8}, gen, DType::f32).to(dtype), f);
  };
  const auto w_of = [&](int64_t c, DType dtype) {
    return on_gpu(random({4, c, 3, 3}, gen, DType::f32).to(dtype));
  };
  const MemoryFormat cl = MemoryFormat::channels_last;
  EXPECT_TRUE(ran(x_of(3, DType::bf16, cl), w_of(3, DType::bf16), p));
  EXPECT_FALSE(ran(x_of(5, DType::bf16, cl), w_of(5, DType::bf16), p));
  EXPECT_FALSE(ran(x_of(3, DType::f32, cl), w_of(3, DType::f32), p));
  EXPECT_FALSE(ran(x_of(3, DType::bf16, MemoryFormat::contiguous), w_of(3, DType::bf16), p));
  // One channel: NCHW has channels-last strides too, but the output must stay NCHW, as cuDNN's does.
  const Tensor grey = on_gpu(random({2, 1, 8, 8}, gen).to(DType::bf16));
  EXPECT_FALSE(ran(grey, w_of(1, DType::bf16), p));
  EXPECT_TRUE(dev().conv2d(grey, w_of(1, DType::bf16), Tensor(), p).is_contiguous());
  Conv2dParams grouped = p;
  grouped.groups = 2;
  EXPECT_FALSE(ran(x_of(4, DType::bf16, cl), on_gpu(random({4, 2, 3, 3}, gen).to(DType::bf16)), grouped));
  testing::set_backend_option(&runtime::BackendOptions::deterministic, true);
  EXPECT_FALSE(ran(x_of(3, DType::bf16, cl), w_of(3, DType::bf16), p));
  testing::set_backend_option(&runtime::BackendOptions::deterministic, false);
}

}  // namespace
}  // namespace trainer
