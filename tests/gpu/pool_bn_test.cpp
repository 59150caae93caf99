// Pooling and batch norm against the CPU backend: padding, ceil_mode and count_include_pad, NCHW and
// channels-last inputs, BN training statistics (including |mean| >> std), apply and both backward
// kernels, in f32 and f64 (and f16/bf16 for BN against an f32 reference).
#include "op_cases/op_case.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

const MemoryFormat kFormats[] = {MemoryFormat::contiguous, MemoryFormat::channels_last};

TEST(CudaPool, MaxPoolAndBackward) {
  REQUIRE_GPU();
  Generator gen(30);
  const std::vector<Pool2dParams> cases = {op_cases::pool_params(2, 2), op_cases::pool_params(3, 2, 1),
                                           op_cases::pool_params(3, 2, 0, true), op_cases::pool_params(2, 1),
                                           op_cases::pool_params(3, 3, 1, true)};
  for (DType dtype : {DType::f32, DType::f64})
    for (const Pool2dParams& p : cases)
      for (MemoryFormat f : kFormats) {
        const Tensor x = random({2, 5, 11, 10}, gen, dtype);
        const auto [y, idx] = cpu().max_pool2d(x, p);
        const auto [yg, idxg] = dev().max_pool2d(on_gpu(x, f), p);
        EXPECT_TRUE(yg.is_contiguous(f));
        expect_equal(y, yg, "max_pool2d");
        expect_equal(idx, idxg, "max_pool2d indices");
        const Tensor dy = random(y.shape(), gen, dtype);
        const Tensor dx = dev().max_pool2d_backward(on_gpu(dy, f), idxg, x.shape(), p);
        expect_close(cpu().max_pool2d_backward(dy, idx, x.shape(), p), dx, 1e-6, 1e-7, "max_pool2d_backward");
      }
  // NaN wins the window (the last NaN, as on the CPU).
  Tensor x = Tensor::zeros({1, 1, 2, 2});
  x.slice(3, 1, 2).fill_(std::nan(""));
  const auto [y, idx] = dev().max_pool2d(x.to(gpu()), op_cases::pool_params(2, 2));
  EXPECT_TRUE(std::isnan(y.item()));
  EXPECT_EQ(idx.item(), cpu().max_pool2d(x, op_cases::pool_params(2, 2)).second.item());
  EXPECT_EQ(idx.item(), 3.0);
}

// Channels-last tensors whose channels fill 16-byte packs take the vectorised kernels (a thread per
// pack of one pixel); half types against the CPU on the same values in f32.
// u8 offsets within each window (row-major from its padded origin) as i64 positions into H*W, on the
// host in NCHW order: what the CPU backend's max_pool2d returns.
Tensor positions_of(const Tensor& offsets, const Shape& x, const Pool2dParams& p) {
  const Tensor o = offsets.to(Device::cpu()).contiguous().to(DType::i64);
  const std::vector<int64_t> v = o.to_vector<int64_t>();
  const int64_t OH = o.size(2), OW = o.size(3);
  std::vector<int64_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t ow = static_cast<int64_t>(i) % OW, oh = static_cast<int64_t>(i) / OW % OH;
    const int64_t ih = oh * p.stride_h - p.pad_h + v[i] / p.kernel_w,
                  iw = ow * p.stride_w - p.pad_w + v[i] % p.kernel_w;
    out[i] = ih * x[3] + iw;
  }
  return Tensor::from_vector(out, o.shape());
}

TEST(CudaPool, MaxPoolChannelsLastPacksMatchTheCpu) {
  REQUIRE_GPU();
  Generator gen(32);
  const std::vector<Pool2dParams> cases = {op_cases::pool_params(3, 2, 1), op_cases::pool_params(2, 2),
                                           op_cases::pool_params(3, 3, 1, true), op_cases::pool_params(2, 1)};
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (const Pool2dParams& p : cases) {
      const std::string what = std::string(dtype_name(dtype)) + " kernel " + std::to_string(p.kernel_h) +
                               " stride " + std::to_string(p.stride_h);
      const Tensor x = random({3, 16, 13, 12}, gen, dtype);
      const auto [y, idx] = cpu().max_pool2d(as_f32(x), p);
      const auto [yg, idxg] = dev().max_pool2d(on_gpu(x, MemoryFormat::channels_last), p);
      EXPECT_TRUE(yg.is_contiguous(MemoryFormat::channels_last)) << what;
      expect_equal(y, as_f32(yg), what + " max_pool2d");
      EXPECT_EQ(idxg.dtype(), DType::u8) << what;  // offsets within the window
      expect_equal(idx, positions_of(idxg, x.shape(), p), what + " max_pool2d indices");
      const Tensor dy = random(y.shape(), gen, dtype);
      const Tensor dx =
          dev().max_pool2d_backward(on_gpu(dy, MemoryFormat::channels_last), idxg, x.shape(), p);
      // The per-element gather reads the offsets too (a gradient in the other format).
      expect_close(as_f32(dx), as_f32(dev().max_pool2d_backward(on_gpu(dy), idxg, x.shape(), p)), 0.0, 0.0,
                   what + " max_pool2d_backward, NCHW gradient");
      EXPECT_TRUE(dx.is_contiguous(MemoryFormat::channels_last)) << what;
      const double tol = dtype == DType::f32 ? 1e-6 : 1e-2;
      expect_close(cpu().max_pool2d_backward(as_f32(dy), idx, x.shape(), p), as_f32(dx), tol, tol,
                   what + " max_pool2d_backward");
    }
}

// The pack kernels' other index cases: f64 (two values a pack, so the u8 offsets load 2 bytes at a
// time) and a window of more than 256 elements (17x17), where they keep i64 positions.
TEST(CudaPool, MaxPoolPacksInF64AndWithWindowsPast256) {
  REQUIRE_GPU();
  Generator gen(33);
  struct Case {
    DType dtype;
    Shape x;
    Pool2dParams p;
    DType index;
  };
  const std::vector<Case> cases = {
      {DType::f64, {2, 4, 9, 8}, op_cases::pool_params(3, 2, 1), DType::u8},
      {DType::bf16, {2, 8, 20, 19}, op_cases::pool_params(17, 2, 8), DType::i64}};
  for (const Case& c : cases) {
    const std::string what = std::string(dtype_name(c.dtype)) + " x " + shape_str(c.x);
    const Tensor x = random(c.x, gen, c.dtype);
    const Tensor x64 = x.to(DType::f64);
    const auto [y, idx] = cpu().max_pool2d(x64, c.p);
    const auto [yg, idxg] = dev().max_pool2d(on_gpu(x, MemoryFormat::channels_last), c.p);
    EXPECT_EQ(idxg.dtype(), c.index) << what;
    expect_equal(y, yg.to(Device::cpu()).to(DType::f64), what + " max_pool2d");
    expect_equal(idx,
                 c.index == DType::u8 ? positions_of(idxg, c.x, c.p) : idxg.to(Device::cpu()).contiguous(),
                 what + " max_pool2d indices");
    const Tensor dy = random(y.shape(), gen, c.dtype);
    const Tensor dx = dev().max_pool2d_backward(on_gpu(dy, MemoryFormat::channels_last), idxg, c.x, c.p);
    const double tol = c.dtype == DType::f64 ? 1e-12 : 1e-2;
    expect_close(cpu().max_pool2d_backward(dy.to(DType::f64), idx, c.x, c.p),
                 dx.to(Device::cpu()).to(DType::f64), tol, tol, what + " max_pool2d_backward");
  }
}

TEST(CudaPool, AvgPoolGlobalPoolAndBackward) {
  REQUIRE_GPU();
  Generator gen(31);
  const std::vector<Pool2dParams> cases = {op_cases::pool_params(2, 2), op_cases::pool_params(3, 2, 1),
                                           op_cases::pool_params(3, 2, 1, true, false),
                                           op_cases::pool_params(3, 2, 0, true),
                                           op_cases::pool_params(4, 3, 2, true, true)};
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = dtype == DType::f32 ? 1e-6 : 1e-14;
    for (const Pool2dParams& p : cases)
      for (MemoryFormat f : kFormats) {
        const Tensor x = random({2, 3, 11, 10}, gen, dtype);
        const Tensor y = cpu().avg_pool2d(x, p);
        expect_close(y, dev().avg_pool2d(on_gpu(x, f), p), tol, tol, "avg_pool2d");
        const Tensor dy = random(y.shape(), gen, dtype);
        expect_close(cpu().avg_pool2d_backward(dy, x.shape(), p),
                     dev().avg_pool2d_backward(on_gpu(dy, f), x.shape(), p), tol, tol, "avg_pool2d_backward");
      }
    for (MemoryFormat f : kFormats) {
      const Tensor x = random({3, 7, 6, 5}, gen, dtype);
      expect_close(cpu().global_avg_pool(x), dev().global_avg_pool(on_gpu(x, f)), tol, tol,
                   "global_avg_pool");
      const Tensor dy = random({3, 7}, gen, dtype);
      const Tensor dx = dev().global_avg_pool_backward(dy.to(gpu()), x.shape(), f);
      EXPECT_TRUE(dx.is_contiguous(f));
      expect_close(cpu().global_avg_pool_backward(dy, x.shape(), MemoryFormat::contiguous), dx, tol, tol,
                   "global_avg_pool_backward");
    }
  }
  // Half types against an f32 reference.
  const Tensor h = random({2, 4, 8, 8}, gen, DType::bf16);
  expect_close(cpu().avg_pool2d(as_f32(h), op_cases::pool_params(2, 2)),
               dev().avg_pool2d(h.to(gpu()), op_cases::pool_params(2, 2)), 1e-2, 1e-2, "avg_pool2d bf16");
}

struct BnCase {
  Shape shape;
  MemoryFormat format;
  double offset;  // added to every value: BN statistics must not cancel when |mean| >> std
};

TEST(CudaBatchNorm, TrainingStatisticsApplyAndBackward) {
  REQUIRE_GPU();
  Generator gen(32);
  const std::vector<BnCase> cases = {{{8, 6, 7, 5}, MemoryFormat::contiguous, 0.0},
                                     {{8, 6, 7, 5}, MemoryFormat::channels_last, 0.0},
                                     {{64, 40}, MemoryFormat::contiguous, 0.0},
                                     {{16, 3, 30, 30}, MemoryFormat::contiguous, 1000.0},
                                     {{16, 70, 9, 9}, MemoryFormat::channels_last, 1000.0},
                                     {{256, 32, 28, 28}, MemoryFormat::contiguous, 0.5},
                                     // channels-last with C a multiple of 4: the 16-byte-load reduction
                                     {{32, 64, 6, 6}, MemoryFormat::channels_last, 1000.0},
                                     {{128, 256, 4, 4}, MemoryFormat::channels_last, 0.5},
                                     {{4, 2048, 3, 3}, MemoryFormat::channels_last, 0.0}};
  for (DType dtype : {DType::f32, DType::f64})
    for (const BnCase& c : cases) {
      const std::string what =
          "bn " + shape_str(c.shape) + (c.format == MemoryFormat::channels_last ? " nhwc" : "");
      const double tol = dtype == DType::f32 ? 2e-5 : 1e-11;
      const int64_t C = c.shape[1];
      Tensor x = random(c.shape, gen, DType::f64, c.offset - 1.0, c.offset + 1.0).to(dtype);
      const Tensor xg = on_gpu(x, c.format);
      const auto [mean, var] = cpu().bn_mean_var(x);
      const auto [mean_g, var_g] = dev().bn_mean_var(xg);
      EXPECT_EQ(mean_g.dtype(), dtype);
      expect_close(mean, mean_g, tol, 1e-12, what + " mean");
      expect_close(var, var_g, tol * 10, 1e-12, what + " var");

      const Tensor invstd = cpu().binary_scalar(
          BinaryOp::div, cpu().unary(UnaryOp::sqrt, cpu().binary_scalar(BinaryOp::add, var, 1e-5, false)),
          1.0, true);
      const Tensor gamma = random({C}, gen, dtype, 0.5, 1.5), beta = random({C}, gen, dtype);
      for (bool affine : {true, false}) {
        const Tensor gm = affine ? gamma : Tensor(), bt = affine ? beta : Tensor();
        const Tensor y = cpu().bn_apply(x, mean, invstd, gm, bt, {});
        const Tensor yg =
            dev().bn_apply(xg, mean.to(gpu()), invstd.to(gpu()), affine ? gamma.to(gpu()) : Tensor(),
                           affine ? beta.to(gpu()) : Tensor(), {});
        EXPECT_TRUE(yg.is_contiguous(c.format));
        expect_close(y, yg, tol, tol, what + " apply");
      }
      const Tensor dy = random(c.shape, gen, dtype);
      const Tensor dyg = on_gpu(dy, c.format);
      const auto [sdy, sdyx] = cpu().bn_backward_reduce(dy, x, mean, invstd, Tensor());
      const auto [sdy_g, sdyx_g] =
          dev().bn_backward_reduce(dyg, xg, mean.to(gpu()), invstd.to(gpu()), Tensor());
      const double scale = std::sqrt(static_cast<double>(x.numel() / C));  // sums of ~N random terms
      expect_close(sdy, sdy_g, tol, tol * scale, what + " sum_dy");
      expect_close(sdyx, sdyx_g, tol, tol * scale * 10, what + " sum_dy_xhat");
      const int64_t count = x.numel() / C;
      const Tensor dx = cpu().bn_backward_input(dy, x, mean, invstd, gamma, sdy, sdyx, count, Tensor());
      const Tensor dxg = dev().bn_backward_input(dyg, xg, mean.to(gpu()), invstd.to(gpu()), gamma.to(gpu()),
                                                 sdy.to(gpu()), sdyx.to(gpu()), count, Tensor());
      EXPECT_TRUE(dxg.is_contiguous(c.format));
      expect_close(dx, dxg, tol * 10, tol * 10, what + " backward_input");
    }
}

TEST(CudaBatchNorm, HalfTypesAgainstF32) {
  REQUIRE_GPU();
  Generator gen(33);
  for (DType dtype : {DType::f16, DType::bf16}) {
    const Tensor x = random({16, 8, 6, 6}, gen, dtype, -2.0, 3.0);
    const Tensor xg = on_gpu(x, MemoryFormat::channels_last);
    const auto [mean, var] = cpu().bn_mean_var(as_f32(x));
    const auto [mean_g, var_g] = dev().bn_mean_var(xg);
    expect_close(mean, mean_g, 1e-2, 1e-2, "bn half mean");
    expect_close(var, var_g, 1e-2, 1e-2, "bn half var");
    const Tensor invstd = Tensor::full({8}, 0.8), gamma = Tensor::full({8}, 1.5);
    expect_close(cpu().bn_apply(as_f32(x), mean, invstd, gamma, Tensor(), {}),
                 dev().bn_apply(xg, mean.to(gpu()), invstd.to(gpu()), gamma.to(gpu()), Tensor(), {}), 2e-2,
                 2e-2, "bn half apply");
  }
}

// Training statistics with the running-statistics update in the same kernel, against the CPU.
TEST(CudaBatchNorm, TrainStatsUpdateTheRunningStatisticsLikeTheCpu) {
  REQUIRE_GPU();
  Generator gen(35);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16})
    for (MemoryFormat f : kFormats)
      for (const Shape& shape : {Shape{8, 16, 5, 6}, Shape{64, 128, 4, 4}}) {
        const int64_t C = shape[1];
        const Tensor x = random(shape, gen, dtype, 99.0, 101.0);
        const DType running_dtype = dtype == DType::f64 ? DType::f64 : DType::f32;
        Tensor rm = random({C}, gen, running_dtype), rv = random({C}, gen, running_dtype, 0.5, 1.5);
        Tensor rm_g = rm.to(gpu()), rv_g = rv.to(gpu());
        const Tensor xc = dtype == DType::bf16 ? as_f32(x) : x;
        const auto [mean, invstd] = cpu().bn_train_stats(xc, 1e-5, 0.1, rm, rv);
        const auto [mean_g, invstd_g] = dev().bn_train_stats(on_gpu(x, f), 1e-5, 0.1, rm_g, rv_g);
        const double tol = dtype == DType::f64 ? 1e-11 : 1e-5;
        const std::string what =
            std::string("train stats ") + std::string(dtype_name(dtype)) + " " + shape_str(shape);
        expect_close(mean, mean_g, tol, tol, what + " mean");
        expect_close(invstd, invstd_g, tol * 10, tol * 10, what + " invstd");
        expect_close(rm, rm_g, tol, tol, what + " running_mean");
        expect_close(rv, rv_g, tol * 10, tol * 10, what + " running_var");
      }
}

// The ReLU's backward folded into both batch-norm backward kernels, against the CPU.
TEST(CudaBatchNorm, BackwardThroughAFusedReluMatchesTheCpu) {
  REQUIRE_GPU();
  Generator gen(36);
  for (DType dtype : {DType::f32, DType::bf16})
    for (MemoryFormat f : kFormats)
      for (const Shape& shape : {Shape{8, 16, 5, 6}, Shape{32, 64, 4, 4}}) {
        const int64_t C = shape[1];
        const Tensor x = random(shape, gen, dtype), dy = random(shape, gen, dtype);
        const Tensor relu_out = cpu().unary(UnaryOp::relu, as_f32(random(shape, gen, dtype))).to(dtype);
        const Tensor mean = random({C}, gen, DType::f32), invstd = random({C}, gen, DType::f32, 0.5, 1.5),
                     gamma = random({C}, gen, DType::f32, 0.5, 1.5);
        const auto [s0, s1] = cpu().bn_backward_reduce(as_f32(dy), as_f32(x), mean, invstd, as_f32(relu_out));
        const auto [g0, g1] = dev().bn_backward_reduce(on_gpu(dy, f), on_gpu(x, f), mean.to(gpu()),
                                                       invstd.to(gpu()), on_gpu(relu_out, f));
        const std::string what =
            std::string("masked ") + std::string(dtype_name(dtype)) + " " + shape_str(shape);
        const double tol = dtype == DType::f32 ? 1e-5 : 1e-2;
        expect_close(s0, g0, tol, tol, what + " sum_dy");
        expect_close(s1, g1, tol, tol, what + " sum_dy_xhat");
        const int64_t count = x.numel() / C;
        const Tensor dx = cpu().bn_backward_input(as_f32(dy), as_f32(x), mean, invstd, gamma, s0, s1, count,
                                                  as_f32(relu_out));
        const Tensor dxg =
            dev().bn_backward_input(on_gpu(dy, f), on_gpu(x, f), mean.to(gpu()), invstd.to(gpu()),
                                    gamma.to(gpu()), s0.to(gpu()), s1.to(gpu()), count, on_gpu(relu_out, f));
        EXPECT_TRUE(dxg.is_contiguous(f));
        expect_close(dx, dxg, tol, tol, what + " backward_input");
      }
}

// The fused tail relu(bn(x) + residual) equals the CPU backend's, in every layout and in bf16
// (computed in f32 and rounded once, so within a bf16 step of the f32 reference).
TEST(CudaBatchNorm, ApplyWithResidualAndRelu) {
  REQUIRE_GPU();
  Generator gen(34);
  for (DType dtype : {DType::f32, DType::bf16})
    for (MemoryFormat f : kFormats)
      for (bool with_residual : {false, true}) {
        const int64_t C = 16;
        const Tensor x = random({8, C, 5, 6}, gen, dtype, -2.0, 2.0), r = random({8, C, 5, 6}, gen, dtype);
        const Tensor mean = random({C}, gen, DType::f32), invstd = random({C}, gen, DType::f32, 0.5, 1.5),
                     gamma = random({C}, gen, DType::f32, 0.5, 1.5), beta = random({C}, gen, DType::f32);
        const Tensor expected = cpu().bn_apply(as_f32(x), mean, invstd, gamma, beta,
                                               {with_residual ? as_f32(r) : Tensor(), true});
        const Tensor got = dev().bn_apply(on_gpu(x, f), mean.to(gpu()), invstd.to(gpu()), gamma.to(gpu()),
                                          beta.to(gpu()), {with_residual ? on_gpu(r, f) : Tensor(), true});
        EXPECT_TRUE(got.is_contiguous(f));
        const double tol = dtype == DType::f32 ? 1e-6 : 1e-2;
        expect_close(expected, got, tol, tol, std::string("bn tail ") + std::string(dtype_name(dtype)));
      }
}

}  // namespace
}  // namespace trainer
