// matmul (cuBLAS) and convolution (cuDNN) against the CPU backend: every transpose combination and
// transposed views; convolutions with stride, padding, dilation and groups in NCHW and NHWC, with
// TF32 off (f32 to ~1e-4) and in f64 (tight), plus f16/bf16 against an f32 reference.
#include <algorithm>

#include "op_cases/op_case.h"
#include "tests/gpu/backend_options.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

// Tolerance relative to the largest magnitude of the expected result (sums of products cancel).
void expect_close_scaled(const Tensor& expected, const Tensor& actual, double rtol, const std::string& what) {
  double scale = 0.0;
  for (double v : expected.to_vector<double>()) scale = std::max(scale, std::abs(v));
  expect_close(expected, actual, rtol, rtol * std::max(scale, 1e-30), what);
}

TEST(CudaMatmul, AllTransposesAndViews) {
  REQUIRE_GPU();
  testing::set_backend_option(&runtime::BackendOptions::allow_tf32, false);
  Generator gen(20);
  const int64_t m = 37, k = 53, n = 29;
  for (DType dtype : {DType::f32, DType::f64})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Tensor a = random(ta ? Shape{k, m} : Shape{m, k}, gen, dtype);
        const Tensor b = random(tb ? Shape{n, k} : Shape{k, n}, gen, dtype);
        const double tol = dtype == DType::f32 ? 1e-5 : 1e-13;
        const Tensor expected = cpu().matmul(a, b, ta, tb);
        expect_close_scaled(expected, dev().matmul(a.to(gpu()), b.to(gpu()), ta, tb), tol, "matmul");
        // The same product from transposed views (read in place, no copy).
        const Tensor at = a.to(gpu()).permute({1, 0}).contiguous().permute({1, 0});
        const Tensor bt = b.to(gpu()).permute({1, 0}).contiguous().permute({1, 0});
        expect_close_scaled(expected, dev().matmul(at, bt, ta, tb), tol, "matmul views");
      }
  // A sliced (non-unit row stride) operand and a non-dense one.
  const Tensor a = random({8, 20}, gen), b = random({20, 6}, gen);
  const Tensor as = a.slice(1, 0, 10), bs = b.slice(0, 0, 20, 2);
  expect_close_scaled(cpu().matmul(as, bs.contiguous(), false, false),
                      dev().matmul(a.to(gpu()).slice(1, 0, 10), b.to(gpu()).slice(0, 0, 20, 2), false, false),
                      1e-5, "matmul slices");
  // Empty inner dimension gives zeros; half types against the f32 product of the rounded inputs.
  expect_equal(Tensor::zeros({3, 4}), dev().matmul(Tensor::zeros({3, 0}, DType::f32, gpu()),
                                                   Tensor::zeros({0, 4}, DType::f32, gpu()), false, false));
  for (DType half : {DType::f16, DType::bf16}) {
    const Tensor x = random({64, 96}, gen, half), y = random({96, 48}, gen, half);
    expect_close_scaled(cpu().matmul(as_f32(x), as_f32(y), false, false),
                        dev().matmul(x.to(gpu()), y.to(gpu()), false, false),
                        half == DType::f16 ? 2e-3 : 1e-2, "matmul half");
  }
}

struct ConvCase {
  Shape x, w;
  Conv2dParams p;
  bool bias;
};

std::vector<ConvCase> conv_cases() {
  Conv2dParams asym = op_cases::conv_params(1, 0);
  asym.stride_h = 2, asym.pad_w = 2, asym.dilation_w = 2;
  return {
      {{4, 3, 12, 12}, {8, 3, 3, 3}, op_cases::conv_params(1, 1), true},        // the cnn's layer
      {{2, 8, 11, 9}, {16, 8, 3, 3}, op_cases::conv_params(2, 1), true},        // stride 2, odd sizes
      {{2, 6, 10, 10}, {4, 6, 1, 1}, op_cases::conv_params(1, 0), false},       // pointwise
      {{2, 8, 13, 13}, {8, 2, 3, 3}, op_cases::conv_params(1, 2, 2, 4), true},  // dilation 2, groups 4
      {{2, 8, 9, 9}, {8, 1, 3, 3}, op_cases::conv_params(1, 1, 1, 8), false},   // depthwise
      {{3, 3, 15, 14}, {5, 3, 5, 3}, asym, true},  // asymmetric stride/padding/dilation
      {{2, 3, 32, 32}, {16, 3, 7, 7}, op_cases::conv_params(2, 3), false},  // ResNet stem
      {{4, 1, 28, 28},
       {16, 1, 3, 3},
       op_cases::conv_params(1, 1),
       false},  // grey-scale stem: output keeps x's format
  };
}

void run_conv_case(const ConvCase& c, DType dtype, MemoryFormat format, double tol, Generator& gen) {
  const std::string what = "conv x" + shape_str(c.x) + " w" + shape_str(c.w) + " " +
                           std::string(dtype_name(dtype)) +
                           (format == MemoryFormat::channels_last ? " nhwc" : " nchw");
  const bool half = dtype == DType::f16 || dtype == DType::bf16;
  const Tensor x = random(c.x, gen, dtype), w = random(c.w, gen, dtype, -0.5, 0.5);
  const Tensor b = c.bias ? random({c.w[0]}, gen, dtype) : Tensor();
  auto ref = [&](const Tensor& t) { return t.defined() ? (half ? as_f32(t) : t) : Tensor(); };
  const Tensor xg = on_gpu(x, format), wg = w.to(gpu()), bg = c.bias ? b.to(gpu()) : Tensor();

  const Tensor y = cpu().conv2d(ref(x), ref(w), ref(b), c.p);
  const Tensor yg = dev().conv2d(xg, wg, bg, c.p);
  EXPECT_TRUE(yg.is_contiguous(format)) << what;
  expect_close_scaled(y, yg, tol, what + " forward");

  const Tensor dy = random(y.shape(), gen, dtype);
  const Tensor dyg = on_gpu(dy, format);
  const Tensor dx = dev().conv2d_backward_input(dyg, wg, c.x, c.p);
  EXPECT_TRUE(dx.is_contiguous(format)) << what;
  expect_close_scaled(cpu().conv2d_backward_input(ref(dy), ref(w), c.x, c.p), dx, tol,
                      what + " backward_input");
  expect_close_scaled(cpu().conv2d_backward_weight(ref(dy), ref(x), c.w, c.p),
                      dev().conv2d_backward_weight(dyg, xg, c.w, c.p), tol * 2, what + " backward_weight");
}

TEST(CudaConv, Float32NchwAndNhwc) {
  REQUIRE_GPU();
  testing::set_backend_option(&runtime::BackendOptions::allow_tf32, false);
  Generator gen(21);
  for (const ConvCase& c : conv_cases())
    for (MemoryFormat f : {MemoryFormat::contiguous, MemoryFormat::channels_last})
      run_conv_case(c, DType::f32, f, 1e-4, gen);
}

TEST(CudaConv, Float64IsTight) {
  REQUIRE_GPU();
  Generator gen(22);
  for (const ConvCase& c : conv_cases())
    for (MemoryFormat f : {MemoryFormat::contiguous, MemoryFormat::channels_last})
      run_conv_case(c, DType::f64, f, 1e-11, gen);
}

TEST(CudaConv, HalfTypesChannelsLast) {
  REQUIRE_GPU();
  Generator gen(23);
  const std::vector<ConvCase> cases = conv_cases();
  for (DType dtype : {DType::f16, DType::bf16})
    for (size_t i : {size_t{0}, size_t{1}, size_t{3}, size_t{7}})
      run_conv_case(cases[i], dtype, MemoryFormat::channels_last, dtype == DType::f16 ? 1e-2 : 4e-2, gen);
}

TEST(CudaConv, StridedInputsAndErrors) {
  REQUIRE_GPU();
  Generator gen(24);
  const Tensor x = random({2, 4, 9, 9}, gen), w = random({6, 4, 3, 3}, gen);
  // A non-dense input (a spatial slice) is laid out first.
  const Tensor xs = x.slice(3, 0, 9, 2);
  expect_close_scaled(
      cpu().conv2d(xs, w, Tensor(), op_cases::conv_params(1, 1)),
      dev().conv2d(x.to(gpu()).slice(3, 0, 9, 2), w.to(gpu()), Tensor(), op_cases::conv_params(1, 1)), 1e-4,
      "conv strided input");
  EXPECT_THROW(
      dev().conv2d(x.to(gpu()), random({6, 3, 3, 3}, gen).to(gpu()), Tensor(), op_cases::conv_params(1, 1)),
      std::invalid_argument);
  EXPECT_THROW(dev().conv2d(x.to(gpu()), w.to(gpu()), Tensor(), op_cases::conv_params(1, 0, 5)),
               std::invalid_argument);
}

TEST(CudaConv, Tf32IsOptIn) {
  REQUIRE_GPU();
  Generator gen(25);
  const Tensor x = random({8, 64, 16, 16}, gen), w = random({64, 64, 3, 3}, gen);
  const Tensor expected = cpu().conv2d(x, w, Tensor(), op_cases::conv_params(1, 1));
  testing::set_backend_option(&runtime::BackendOptions::allow_tf32, true);
  const Tensor fast = dev().conv2d(x.to(gpu()), w.to(gpu()), Tensor(), op_cases::conv_params(1, 1));
  testing::set_backend_option(&runtime::BackendOptions::allow_tf32, false);
  expect_close_scaled(expected, fast, 1e-2, "conv tf32");
  expect_close_scaled(expected, dev().conv2d(x.to(gpu()), w.to(gpu()), Tensor(), op_cases::conv_params(1, 1)),
                      1e-4, "conv fp32");
}

}  // namespace
}  // namespace trainer
