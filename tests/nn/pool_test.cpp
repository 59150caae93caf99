// Pooling: hand-computed outputs for PyTorch's rules (-inf padding, ceil_mode windows, the avg pool
// divisor), autograd against finite differences, layouts and shape errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "nn/backend.h"
#include "nn/functional.h"
#include "op_cases/op_case.h"
#include "tests/nn/gradcheck.h"

namespace trainer {
namespace {

using testing::random_tensor;

// [1, 1, h, w] holding scale * (0, 1, 2, ...) in f64.
Tensor arange_plane(int64_t h, int64_t w, double scale = 1.0) {
  std::vector<double> v(static_cast<size_t>(h * w));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<double>(i);
  return Tensor::from_vector(v, {1, 1, h, w});
}

void expect_values(const Tensor& t, const Shape& shape, const std::vector<double>& want) {
  ASSERT_EQ(t.shape(), shape);
  const std::vector<double> got = t.to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "element " << i;
}

TEST(MaxPool, TwoByTwo) {
  auto [y, idx] = cpu_backend().max_pool2d(arange_plane(4, 4), op_cases::pool_params(2, 2, 0));
  expect_values(y, {1, 1, 2, 2}, {5, 7, 13, 15});
  EXPECT_EQ(idx.dtype(), DType::i64);
  EXPECT_EQ(idx.to_vector<int64_t>(), (std::vector<int64_t>{5, 7, 13, 15}));
}

TEST(MaxPool, PaddingIsMinusInfinity) {
  // All values <= 0: zero padding would make every output 0.
  auto [y, idx] = cpu_backend().max_pool2d(arange_plane(4, 4, -1.0), op_cases::pool_params(3, 2, 1));
  expect_values(y, {1, 1, 2, 2}, {0, -1, -4, -5});
  EXPECT_EQ(idx.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 4, 5}));
}

TEST(MaxPool, CeilMode) {
  auto [floor_y, floor_idx] = cpu_backend().max_pool2d(arange_plane(5, 5), op_cases::pool_params(2, 2, 0));
  expect_values(floor_y, {1, 1, 2, 2}, {6, 8, 16, 18});
  auto [y, idx] = cpu_backend().max_pool2d(arange_plane(5, 5), op_cases::pool_params(2, 2, 0, true));
  expect_values(y, {1, 1, 3, 3}, {6, 8, 9, 16, 18, 19, 21, 23, 24});
  EXPECT_EQ(idx.to_vector<int64_t>(), (std::vector<int64_t>{6, 8, 9, 16, 18, 19, 21, 23, 24}));
}

TEST(MaxPool, NanPropagates) {
  Tensor x = arange_plane(2, 2);
  x.data<double>()[1] = std::numeric_limits<double>::quiet_NaN();
  auto [y, idx] = cpu_backend().max_pool2d(x, op_cases::pool_params(2, 2, 0));
  EXPECT_TRUE(std::isnan(y.item()));
  EXPECT_EQ(idx.to_vector<int64_t>()[0], 1);
}

TEST(MaxPool, BackwardRoutesToArgmax) {
  Backend& k = cpu_backend();
  auto [y, idx] = k.max_pool2d(arange_plane(4, 4), op_cases::pool_params(2, 2, 0));
  const Tensor g = Tensor::from_vector(std::vector<double>{1, 2, 3, 4}, {1, 1, 2, 2});
  expect_values(k.max_pool2d_backward(g, idx, {1, 1, 4, 4}, op_cases::pool_params(2, 2, 0)), {1, 1, 4, 4},
                {0, 0, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4});
}

TEST(AvgPool, CountIncludePad) {
  const Tensor ones = Tensor::ones({1, 1, 3, 3}, DType::f64);
  expect_values(cpu_backend().avg_pool2d(ones, op_cases::pool_params(3, 1, 1, false, true)), {1, 1, 3, 3},
                {4 / 9.0, 6 / 9.0, 4 / 9.0, 6 / 9.0, 1, 6 / 9.0, 4 / 9.0, 6 / 9.0, 4 / 9.0});
  expect_values(cpu_backend().avg_pool2d(ones, op_cases::pool_params(3, 1, 1, false, false)), {1, 1, 3, 3},
                {1, 1, 1, 1, 1, 1, 1, 1, 1});
}

TEST(AvgPool, CeilModeWindowsOverhangingTheInput) {
  // 5x5, kernel 2, stride 2: the last row/column of windows holds one input row/column.
  expect_values(cpu_backend().avg_pool2d(arange_plane(5, 5), op_cases::pool_params(2, 2, 0, true)),
                {1, 1, 3, 3}, {3, 5, 6.5, 13, 15, 16.5, 20.5, 22.5, 24});
  // 4x4 ones, kernel 3, stride 2, padding 1: windows span rows {-1..1}, {1..3}, {3..4}; the last is
  // clipped to the padded input (rows 3 and 4), so count_include_pad divides by 2 there, not 3.
  const Tensor ones = Tensor::ones({1, 1, 4, 4}, DType::f64);
  const std::vector<double> f{2 / 3.0, 1.0, 0.5};
  std::vector<double> want;
  for (double a : f)
    for (double b : f) want.push_back(a * b);
  expect_values(cpu_backend().avg_pool2d(ones, op_cases::pool_params(3, 2, 1, true, true)), {1, 1, 3, 3},
                want);
  expect_values(cpu_backend().avg_pool2d(ones, op_cases::pool_params(3, 2, 1, true, false)), {1, 1, 3, 3},
                std::vector<double>(9, 1.0));
}

TEST(AvgPool, NonSquareWindow) {
  Pool2dParams p = op_cases::pool_params(1, 1, 0);
  p.kernel_h = 2, p.kernel_w = 3, p.stride_h = 2, p.stride_w = 3;
  // rows {0,1} x cols {0,1,2} and {3,4,5} of a 2x6 arange.
  expect_values(cpu_backend().avg_pool2d(arange_plane(2, 6), p), {1, 1, 1, 2},
                {(0 + 1 + 2 + 6 + 7 + 8) / 6.0, (3 + 4 + 5 + 9 + 10 + 11) / 6.0});
}

TEST(GlobalAvgPool, MeanPerPlane) {
  const Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 10, 20, 30, 40}, {1, 2, 2, 2});
  expect_values(cpu_backend().global_avg_pool(x), {1, 2}, {2.5, 25});
  const Tensor g = Tensor::from_vector(std::vector<double>{4, 8}, {1, 2});
  expect_values(cpu_backend().global_avg_pool_backward(g, {1, 2, 2, 2}, MemoryFormat::contiguous),
                {1, 2, 2, 2}, {1, 1, 1, 1, 2, 2, 2, 2});
  // Channels-last input: the gradient comes back channels-last, with the same values.
  const Tensor g_cl = cpu_backend().global_avg_pool_backward(g, {1, 2, 2, 2}, MemoryFormat::channels_last);
  EXPECT_TRUE(g_cl.is_contiguous(MemoryFormat::channels_last));
  expect_values(g_cl.contiguous(), {1, 2, 2, 2}, {1, 1, 1, 1, 2, 2, 2, 2});
  const Tensor xf = x.to(DType::f32);
  EXPECT_EQ(cpu_backend().global_avg_pool(xf).dtype(), DType::f32);
}

TEST(Pool, AnyInputLayoutGivesTheSameResult) {
  Generator gen(5);
  Backend& k = cpu_backend();
  const Tensor x = random_tensor({2, 3, 5, 6}, gen);
  const Tensor x_cl = x.contiguous(MemoryFormat::channels_last);
  const Pool2dParams p = op_cases::pool_params(3, 2, 1, true);
  EXPECT_EQ(k.max_pool2d(x_cl, p).first.to_vector<double>(), k.max_pool2d(x, p).first.to_vector<double>());
  EXPECT_EQ(k.max_pool2d(x_cl, p).second.to_vector<int64_t>(),
            k.max_pool2d(x, p).second.to_vector<int64_t>());
  EXPECT_EQ(k.avg_pool2d(x_cl, p).to_vector<double>(), k.avg_pool2d(x, p).to_vector<double>());
  EXPECT_EQ(k.global_avg_pool(x_cl).to_vector<double>(), k.global_avg_pool(x).to_vector<double>());
  EXPECT_TRUE(k.max_pool2d(x_cl, p).first.is_contiguous());
}

// ---- gradient checks through autograd, f64

template <class Op>
void pool_gradcheck(const Shape& shape, uint64_t seed, Op op) {
  Generator gen(seed);
  EXPECT_GRADCHECK([op](const std::vector<Variable>& v) { return op(v[0]); },
                   std::vector<Variable>{Variable(random_tensor(shape, gen), true)});
}

TEST(MaxPoolGrad, TwoByTwo) {
  pool_gradcheck({2, 2, 4, 6}, 21,
                 [](const Variable& x) { return F::max_pool2d(x, op_cases::pool_params(2, 2, 0)); });
}
TEST(MaxPoolGrad, OverlappingWindowsWithPadding) {
  pool_gradcheck({2, 2, 5, 5}, 22,
                 [](const Variable& x) { return F::max_pool2d(x, op_cases::pool_params(3, 2, 1)); });
}
TEST(MaxPoolGrad, CeilMode) {
  pool_gradcheck({1, 2, 5, 6}, 23,
                 [](const Variable& x) { return F::max_pool2d(x, op_cases::pool_params(2, 2, 0, true)); });
  pool_gradcheck({1, 2, 6, 5}, 24,
                 [](const Variable& x) { return F::max_pool2d(x, op_cases::pool_params(3, 2, 1, true)); });
}
TEST(MaxPoolGrad, NonSquare) {
  Pool2dParams p = op_cases::pool_params(1, 1, 0);
  p.kernel_h = 3, p.kernel_w = 2, p.stride_h = 1, p.stride_w = 2, p.pad_h = 1;
  pool_gradcheck({2, 1, 5, 6}, 25, [p](const Variable& x) { return F::max_pool2d(x, p); });
}
TEST(AvgPoolGrad, CountIncludePad) {
  pool_gradcheck({2, 2, 5, 5}, 26,
                 [](const Variable& x) { return F::avg_pool2d(x, op_cases::pool_params(3, 2, 1)); });
}
TEST(AvgPoolGrad, CountExcludePad) {
  pool_gradcheck({2, 2, 5, 5}, 27, [](const Variable& x) {
    return F::avg_pool2d(x, op_cases::pool_params(3, 2, 1, false, false));
  });
}
TEST(AvgPoolGrad, CeilMode) {
  pool_gradcheck({1, 2, 6, 5}, 28, [](const Variable& x) {
    return F::avg_pool2d(x, op_cases::pool_params(3, 2, 1, true, true));
  });
  pool_gradcheck({1, 2, 6, 5}, 29, [](const Variable& x) {
    return F::avg_pool2d(x, op_cases::pool_params(3, 2, 1, true, false));
  });
}
TEST(GlobalAvgPoolGrad, Random) {
  pool_gradcheck({2, 3, 4, 5}, 30, [](const Variable& x) { return F::global_avg_pool(x); });
}

// ---- errors name the shapes

TEST(Pool, ShapeErrors) {
  Backend& k = cpu_backend();
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  EXPECT_NE(message([&] {
              k.max_pool2d(Tensor::zeros({3, 4, 4}, DType::f64), op_cases::pool_params(2, 2, 0));
            }).find("[3, 4, 4]"),
            std::string::npos);
  EXPECT_NE(message([&] {
              k.avg_pool2d(Tensor::zeros({1, 1, 1, 1}, DType::f64), op_cases::pool_params(2, 2, 0));
            }).find("[1, 1, 1, 1]"),
            std::string::npos);
  EXPECT_NE(message([&] {
              k.max_pool2d(Tensor::zeros({1, 1, 4, 4}, DType::f64), op_cases::pool_params(2, 2, 2));
            }).find("half the kernel"),
            std::string::npos);
  EXPECT_NE(message([&] {
              k.avg_pool2d_backward(Tensor::zeros({1, 1, 3, 3}, DType::f64), {1, 1, 4, 4},
                                    op_cases::pool_params(2, 2, 0));
            }).find("[1, 1, 3, 3]"),
            std::string::npos);
  EXPECT_NE(
      message([&] {
        k.global_avg_pool_backward(Tensor::zeros({2, 3}, DType::f64), {2, 2, 4, 4}, MemoryFormat::contiguous);
      }).find("[2, 3]"),
      std::string::npos);
}

}  // namespace
}  // namespace trainer
