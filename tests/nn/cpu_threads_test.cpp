// The CPU backend's OpenMP-split kernels (nn/cpu/parallel.h) give bit for bit the results of one
// thread: BatchNorm's statistics, apply (with the residual and ReLU epilogue), backward sums and input
// gradient in both layouts, the residual join's gradient, max-pool's backward, and the SGD and AdamW
// updates. The tensors are above the threshold below which kernels stay on one thread.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "nn/backend.h"
#include "nn/cpu/parallel.h"
#include "nn/random.h"
#include "tests/nn/gradcheck.h"

namespace trainer {
namespace {

using testing::random_tensor;

Backend& k() { return cpu_backend(); }

Tensor random_f32(const Shape& shape, uint64_t seed, MemoryFormat format = MemoryFormat::contiguous) {
  Generator gen(seed);
  return random_tensor(shape, gen).to(DType::f32).contiguous(format);
}

// Runs `compute` with 1 thread and with 2 and expects every returned tensor bitwise equal.
void expect_same_with_threads(const std::function<std::vector<Tensor>()>& compute, const std::string& what) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<Tensor> one = compute();
  omp_set_num_threads(2);
  const std::vector<Tensor> two = compute();
  omp_set_num_threads(saved);
  ASSERT_EQ(one.size(), two.size()) << what;
  for (size_t t = 0; t < one.size(); ++t) {
    ASSERT_EQ(one[t].shape(), two[t].shape()) << what << " #" << t;
    const std::vector<float> a = one[t].to_vector<float>(), b = two[t].to_vector<float>();
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what << " #" << t;
  }
}

class CpuThreads : public ::testing::TestWithParam<MemoryFormat> {};

TEST_P(CpuThreads, BatchNormForwardBackwardMatchOneThread) {
  const MemoryFormat format = GetParam();
  const Shape shape{8, 24, 16, 16};  // 49,152 elements: above kParallelMinElements
  ASSERT_GE(shape_numel(shape), cpu::kParallelMinElements);
  // An offset mean, so that the per-channel sums would round differently if split.
  Generator gen(7);
  const Tensor x = (random_tensor(shape, gen, 2.0, 5.0)).to(DType::f32).contiguous(format);
  const Tensor dy = random_f32(shape, 8, format), residual = random_f32(shape, 9, format);
  const Tensor gamma = random_f32({24}, 10), beta = random_f32({24}, 11);
  expect_same_with_threads(
      [&] {
        Tensor running_mean = Tensor::zeros({24}, DType::f32), running_var = Tensor::ones({24}, DType::f32);
        const auto [mean, invstd] = k().bn_train_stats(x, 1e-5, 0.1, running_mean, running_var);
        const Tensor y = k().bn_apply(x, mean, invstd, gamma, beta, BnEpilogue{residual, true});
        const auto [sum_dy, sum_dy_xhat] = k().bn_backward_reduce(dy, x, mean, invstd, y);
        const Tensor dx = k().bn_backward_input(dy, x, mean, invstd, gamma, sum_dy, sum_dy_xhat,
                                                shape_numel(shape) / 24, y);
        return std::vector<Tensor>{mean, invstd, running_mean, running_var, y, sum_dy, sum_dy_xhat, dx};
      },
      "batch norm");
}

INSTANTIATE_TEST_SUITE_P(Layouts, CpuThreads,
                         ::testing::Values(MemoryFormat::contiguous, MemoryFormat::channels_last));

// Max-pool's backward splits whole planes over the threads, with overlapping windows (3x3, stride 2):
// each plane's sums stay in one thread, in one order. An index outside its plane still stops it with
// the index named, from inside the threads.
TEST(CpuThreads, MaxPoolBackwardMatchesOneThreadAndReportsBadIndices) {
  const Shape shape{4, 16, 24, 24};  // 36,864 input elements per call: above kParallelMinElements
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  const Tensor x = random_f32(shape, 12);
  const auto [y, indices] = k().max_pool2d(x, p);
  const Tensor dy = random_f32(y.shape(), 13);
  expect_same_with_threads(
      [&] { return std::vector<Tensor>{k().max_pool2d_backward(dy, indices, shape, p)}; },
      "max_pool2d_backward");
  Tensor bad = indices.clone();
  bad.data<int64_t>()[bad.numel() - 5] = 24 * 24;  // one past its plane, in the second thread's range
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  try {
    k().max_pool2d_backward(dy, bad, shape, p);
    ADD_FAILURE() << "an index outside its plane was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("index 576 outside the input plane of 576 elements"),
              std::string::npos)
        << e.what();
  }
  omp_set_num_threads(saved);
}

TEST(CpuThreads, ResidualJoinGradientMatchesOneThread) {
  const Shape shape{4, 32, 16, 16};
  const Tensor a = random_f32(shape, 1), b = random_f32(shape, 2);
  const Tensor y = k().unary(UnaryOp::relu, random_f32(shape, 3));
  expect_same_with_threads([&] { return std::vector<Tensor>{k().relu_backward_of_sum(a, b, y)}; },
                           "relu_backward_of_sum");
  // and equal to the unfused ops it stands for
  const Tensor unfused = k().unary_backward(UnaryOp::relu, k().binary(BinaryOp::add, a, b), Tensor(), y);
  const std::vector<float> f = k().relu_backward_of_sum(a, b, y).to_vector<float>(),
                           u = unfused.to_vector<float>();
  EXPECT_EQ(0, std::memcmp(f.data(), u.data(), f.size() * sizeof(float)));
}

TEST(CpuThreads, OptimizerStepsMatchOneThread) {
  const Shape shape{256, 64, 3, 3};  // 147,456 elements, a resnet18 layer's weight
  const Tensor w0 = random_f32(shape, 4), g = random_f32(shape, 5), buf0 = random_f32(shape, 6);
  SgdParams sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  sgd.weight_decay = 5e-4;
  expect_same_with_threads(
      [&] {
        Tensor w = w0.clone(), buf = buf0.clone();
        k().sgd_step(w, g, buf, false, sgd);
        k().sgd_step(w, g, buf, false, sgd);
        return std::vector<Tensor>{w, buf};
      },
      "sgd_step");
  AdamWParams adamw;
  adamw.step = 3;
  expect_same_with_threads(
      [&] {
        Tensor w = w0.clone(), m = buf0.clone(), v = k().unary(UnaryOp::abs, buf0);
        k().adamw_step(w, g, m, v, adamw);
        return std::vector<Tensor>{w, m, v};
      },
      "adamw_step");
}

}  // namespace
}  // namespace trainer
