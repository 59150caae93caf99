// nn/cuda/depthwise_conv.h: channels-last depthwise convolutions on our own kernels give the CPU
// backend's forward, input gradient and weight gradient (f32 within 1e-5 of the largest value, bf16
// and f16 within half-precision rounding on the same rounded inputs) for 3x3, 5x5 and 7x7 kernels,
// channel counts that are and are not multiples of the vector width, odd and even planes; the weight
// gradient is bitwise reproducible and replays inside a CUDA graph; other convolutions stay on cuDNN.
#include "nn/cuda/depthwise_conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nn/cuda/cuda_graph.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

constexpr MemoryFormat kChannelsLast = MemoryFormat::channels_last;

struct DepthwiseCase {
  int64_t n, c, hw, k;
  bool bias;
  std::string name() const {
    return "N " + std::to_string(n) + " C " + std::to_string(c) + " " + std::to_string(hw) + "x" +
           std::to_string(hw) + " kernel " + std::to_string(k) + (bias ? " with bias" : "");
  }
};

Conv2dParams same_padding(int64_t k, int64_t channels) {
  Conv2dParams p;
  p.pad_h = p.pad_w = static_cast<int>(k / 2);
  p.groups = static_cast<int>(channels);
  return p;
}

// C 8 and 96 take 4-channel (half) or 2-channel (f32) vectors, 100 takes them too but not 8-wide ones,
// 25 takes one channel per thread; planes of 7, 9, 14 and 56 leave partial 8-column tiles or none.
std::vector<DepthwiseCase> cases() {
  std::vector<DepthwiseCase> out;
  int i = 0;
  for (int64_t c : {8, 96, 100, 25})
    for (int64_t hw : {7, 9, 14})
      for (int64_t k : {3, 5, 7}) {
        out.push_back({2 + i % 3, c, hw, k, i % 2 == 0});
        ++i;
      }
  out.push_back({2, 96, 56, 7, true});  // ConvNeXt-T's first stage
  out.push_back({3, 100, 56, 3, false});
  return out;
}

void check_case(const DepthwiseCase& dc, DType dtype, Generator& gen) {
  const std::string what = std::string(dtype_name(dtype)) + " " + dc.name();
  const double rtol = dtype == DType::f32 ? 1e-5 : 1e-2;
  const Conv2dParams p = same_padding(dc.k, dc.c);
  const Tensor x = random({dc.n, dc.c, dc.hw, dc.hw}, gen, DType::f32).to(dtype);  // [N, C, H, W]
  const Tensor w = random({dc.c, 1, dc.k, dc.k}, gen, DType::f32, -0.5, 0.5).to(dtype);
  const Tensor b = dc.bias ? random({dc.c}, gen, DType::f32).to(dtype) : Tensor();
  const Tensor dy = random(x.shape(), gen, DType::f32).to(dtype);
  const Tensor gx = on_gpu(x, kChannelsLast), gw = on_gpu(w), gdy = on_gpu(dy, kChannelsLast);
  const int64_t calls = cuda::depthwise_conv_calls();

  const Tensor y = dev().conv2d(gx, gw, dc.bias ? on_gpu(b) : Tensor(), p);
  EXPECT_TRUE(y.is_contiguous(kChannelsLast)) << what;
  expect_near_scale(cpu().conv2d(as_f32(x), as_f32(w), dc.bias ? as_f32(b) : Tensor(), p), as_f32(y), rtol,
                    what + " forward");
  const Tensor dx = dev().conv2d_backward_input(gdy, gw, x.shape(), p);
  EXPECT_TRUE(dx.is_contiguous(kChannelsLast)) << what;
  expect_near_scale(cpu().conv2d_backward_input(as_f32(dy), as_f32(w), x.shape(), p), as_f32(dx), rtol,
                    what + " input gradient");
  const Tensor dw_ref = cpu().conv2d_backward_weight(as_f32(dy), as_f32(x), w.shape(), p);
  expect_near_scale(dw_ref, as_f32(dev().conv2d_backward_weight(gdy, gx, w.shape(), p)), rtol,
                    what + " weight gradient");
  // grad_y in NCHW (an op before may leave it so): read through the channels-last copy.
  expect_near_scale(dw_ref, as_f32(dev().conv2d_backward_weight(on_gpu(dy), gx, w.shape(), p)), rtol,
                    what + " weight gradient of an NCHW grad_y");
  EXPECT_EQ(cuda::depthwise_conv_calls() - calls, 4) << what << ": the depthwise kernels must run";
}

TEST(DepthwiseConv, ForwardAndGradientsGiveTheCpuConvolution) {
  REQUIRE_GPU();
  Generator gen(38);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (const DepthwiseCase& dc : cases()) check_case(dc, dtype, gen);
}

// The bias gradient from the weight gradient's pass: the sum of grad_y over N, H, W.
TEST(DepthwiseConv, WeightPassAlsoGivesTheBiasGradient) {
  REQUIRE_GPU();
  Generator gen(39);
  for (DType dtype : {DType::f32, DType::bf16})
    for (int64_t c : {96, 25}) {
      const std::string what = std::string(dtype_name(dtype)) + " C " + std::to_string(c);
      const Conv2dParams p = same_padding(7, c);
      const Tensor x = random({3, c, 14, 14}, gen).to(dtype), dy = random(x.shape(), gen).to(dtype);
      Tensor db;
      const Tensor dw = cuda::depthwise_conv_backward_weight(
          on_gpu(dy, kChannelsLast), on_gpu(x, kChannelsLast), {c, 1, 7, 7}, p, kChannelsLast, &db);
      const double rtol = dtype == DType::f32 ? 1e-5 : 1e-2;
      expect_near_scale(cpu().conv2d_backward_weight(as_f32(dy), as_f32(x), {c, 1, 7, 7}, p), as_f32(dw),
                        rtol, what + " weight gradient");
      expect_near_scale(cpu().sum(as_f32(dy), {0, 2, 3}, false), as_f32(db), rtol, what + " bias gradient");
    }
}

// Two runs of the weight gradient agree bit for bit (train.deterministic and the CUDA-graph checks
// rely on it): the partials are added in a fixed order.
TEST(DepthwiseConv, WeightGradientIsBitwiseReproducible) {
  REQUIRE_GPU();
  Generator gen(40);
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Conv2dParams p = same_padding(7, 96);
    const Tensor x = on_gpu(random({4, 96, 56, 56}, gen).to(dtype), kChannelsLast);
    const Tensor dy = on_gpu(random({4, 96, 56, 56}, gen).to(dtype), kChannelsLast);
    const Tensor first = dev().conv2d_backward_weight(dy, x, {96, 1, 7, 7}, p);
    for (int run = 0; run < 3; ++run)
      expect_equal(as_f32(first), as_f32(dev().conv2d_backward_weight(dy, x, {96, 1, 7, 7}, p)),
                   std::string(dtype_name(dtype)) + " run " + std::to_string(run));
  }
}

// The weight gradient's partials come from the caching allocator inside the capture; each replay
// reads the inputs copied in before it and gives the eager results bit for bit.
TEST(DepthwiseConv, ReplaysInsideACudaGraph) {
  REQUIRE_GPU();
  Generator gen(41);
  const Conv2dParams p = same_padding(7, 96);
  const Shape shape{2, 96, 14, 14};
  Tensor x = on_gpu(random(shape, gen).to(DType::bf16), kChannelsLast);
  Tensor dy = on_gpu(random(shape, gen).to(DType::bf16), kChannelsLast);
  const Tensor w = on_gpu(random({96, 1, 7, 7}, gen).to(DType::bf16));
  const Tensor b = on_gpu(random({96}, gen).to(DType::bf16));
  // The graph writes the outputs it allocated while capturing; the eager steps write their own (a
  // replay writes the captured addresses, not whatever tensor a variable names since).
  struct Outputs {
    Tensor y, dx, dw;
  };
  const auto step = [&](Outputs& out) {
    out.y = dev().conv2d(x, w, b, p);
    out.dx = dev().conv2d_backward_input(dy, w, shape, p);
    out.dw = dev().conv2d_backward_weight(dy, x, {96, 1, 7, 7}, p);
  };
  Outputs graphed, eager;
  step(eager);  // eager once first, as a training step is
  cuda::CudaGraph graph;
  graph.capture([&] { step(graphed); });
  for (int replay = 0; replay < 2; ++replay) {
    x.copy_(on_gpu(random(shape, gen).to(DType::bf16), kChannelsLast));
    dy.copy_(on_gpu(random(shape, gen).to(DType::bf16), kChannelsLast));
    graph.replay();
    step(eager);
    const std::string what = "replay " + std::to_string(replay);
    expect_equal(as_f32(eager.y), as_f32(graphed.y), what + " forward");
    expect_equal(as_f32(eager.dx), as_f32(graphed.dx), what + " input gradient");
    expect_equal(as_f32(eager.dw), as_f32(graphed.dw), what + " weight gradient");
  }
}

// cuDNN keeps NCHW inputs, strides, dilation, padding other than kernel / 2, grouped (not depthwise)
// and even or non-square kernels, f64, and single-channel layers.
TEST(DepthwiseConv, OtherConvolutionsStayOnCudnn) {
  REQUIRE_GPU();
  Generator gen(42);
  const auto runs_depthwise = [&](const Shape& xs, const Shape& ws, const Conv2dParams& p, MemoryFormat f,
                                  DType dtype = DType::bf16) {
    const Tensor x = on_gpu(random(xs, gen).to(dtype), f), w = on_gpu(random(ws, gen).to(dtype));
    const int64_t before = cuda::depthwise_conv_calls();
    dev().conv2d(x, w, Tensor(), p);
    return cuda::depthwise_conv_calls() > before;
  };
  const Shape xs{2, 16, 9, 9}, ws{16, 1, 7, 7};
  const Conv2dParams p = same_padding(7, 16);
  EXPECT_TRUE(runs_depthwise(xs, ws, p, kChannelsLast));
  EXPECT_TRUE(runs_depthwise(xs, ws, p, kChannelsLast, DType::f32));
  EXPECT_FALSE(runs_depthwise(xs, ws, p, MemoryFormat::contiguous));
  EXPECT_FALSE(runs_depthwise(xs, ws, p, kChannelsLast, DType::f64));
  Conv2dParams strided = p, dilated = p, padded = p, grouped = p;
  strided.stride_h = strided.stride_w = 2;
  dilated.dilation_h = dilated.dilation_w = 2;
  padded.pad_h = padded.pad_w = 2;
  grouped.groups = 8;
  EXPECT_FALSE(runs_depthwise(xs, ws, strided, kChannelsLast));
  EXPECT_FALSE(runs_depthwise(xs, ws, dilated, kChannelsLast));
  EXPECT_FALSE(runs_depthwise(xs, ws, padded, kChannelsLast));
  EXPECT_FALSE(runs_depthwise(xs, {16, 2, 7, 7}, grouped, kChannelsLast));
  Conv2dParams rect = same_padding(3, 16);
  rect.pad_w = 2;
  EXPECT_FALSE(runs_depthwise(xs, {16, 1, 3, 5}, rect, kChannelsLast));
  EXPECT_FALSE(runs_depthwise(xs, {16, 1, 4, 4}, same_padding(4, 16), kChannelsLast));
  EXPECT_FALSE(runs_depthwise({2, 1, 9, 9}, {1, 1, 7, 7}, same_padding(7, 1), kChannelsLast));
}

}  // namespace
}  // namespace trainer
