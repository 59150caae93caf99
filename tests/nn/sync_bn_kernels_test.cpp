// The synchronised batch norm's backend pieces (Backend::sync_bn_*) on the CPU against the batch-norm
// kernels they stand in for: the packed sums are the count times bn_mean_var's moments, the
// statistics from one shard's sums are bn_train_stats's, those from two shards' added sums are the
// whole batch's, and the gradient sums are bn_backward_reduce's (and, packed, divided by the count).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "nn/backend.h"
#include "nn/random.h"
#include "tests/nn/gradcheck.h"

namespace trainer {
namespace {

using testing::random_tensor;

constexpr double kEps = 1e-5, kMomentum = 0.1;

Backend& k() { return cpu_backend(); }

// |a - b| <= rtol * (1 + |b|) for every element.
void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rtol,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(std::abs(a[i] - b[i]), rtol * (1.0 + std::abs(b[i]))) << what << "[" << i << "]";
}
void expect_close(const Tensor& a, const Tensor& b, double rtol, const std::string& what) {
  expect_close(a.to_vector<double>(), b.to_vector<double>(), rtol, what);
}

// A [N, C, H, W] input in `format`, values with a channel-dependent offset (|mean| > std for some).
Tensor input(const Shape& shape, DType dtype, MemoryFormat format, uint64_t seed) {
  Generator gen(seed);
  Tensor x = random_tensor(shape, gen, -1.0, 1.0);
  std::vector<double> v = x.to_vector<double>();
  const int64_t C = shape[1], inner = shape[2] * shape[3];
  for (size_t i = 0; i < v.size(); ++i)
    v[i] += 3.0 * static_cast<double>((static_cast<int64_t>(i) / inner) % C);
  Tensor out = Tensor::empty(shape, dtype, Device::cpu(), format);
  out.copy_(Tensor::from_vector(v, shape));
  return out;
}

Tensor nan_buffer(int64_t n) {
  return Tensor::full({n}, std::numeric_limits<double>::quiet_NaN(), DType::f64);
}

Tensor slice_of(const Tensor& t, int64_t begin, int64_t end) { return t.slice(0, begin, end); }

const MemoryFormat kFormats[] = {MemoryFormat::contiguous, MemoryFormat::channels_last};

TEST(SyncBnKernels, LocalStatsAreTheCountTimesTheMoments) {
  for (DType dtype : {DType::f32, DType::f64})
    for (MemoryFormat f : kFormats) {
      const Tensor x = input({3, 4, 5, 2}, dtype, f, 1);
      const int64_t C = 4;
      const double n = 3 * 5 * 2;
      Tensor packed = nan_buffer(2 * C + 1);
      k().sync_bn_local_stats(x, packed);
      const auto [mean_t, var_t] = k().bn_mean_var(x.to(DType::f64));
      const std::vector<double> mean = mean_t.to_vector<double>(), var = var_t.to_vector<double>();
      std::vector<double> sum(C), sqsum(C);
      for (int64_t c = 0; c < C; ++c) {
        sum[c] = n * mean[c];
        sqsum[c] = n * (var[c] + mean[c] * mean[c]);
      }
      expect_close(slice_of(packed, 0, C).to_vector<double>(), sum, 1e-13, "sum x");
      expect_close(slice_of(packed, C, 2 * C).to_vector<double>(), sqsum, 1e-13, "sum x^2");
      EXPECT_EQ(packed.to_vector<double>()[2 * C], n);
    }
}

TEST(SyncBnKernels, AnEmptyShardWritesZeros) {
  const Tensor x = Tensor::empty({0, 3, 2, 2});
  Tensor packed = nan_buffer(7);
  k().sync_bn_local_stats(x, packed);
  EXPECT_EQ(packed.to_vector<double>(), std::vector<double>(7, 0.0));
  Tensor stats = Tensor::full({7}, 5.0, DType::f64);
  Tensor sums = nan_buffer(6);
  const auto [sum_dy, sum_dy_xhat] =
      k().sync_bn_local_grad_sums(x, x, Tensor::zeros({3}), Tensor::ones({3}), stats, sums);
  EXPECT_EQ(sums.to_vector<double>(), std::vector<double>(6, 0.0));
  EXPECT_EQ(sum_dy.to_vector<double>(), std::vector<double>(3, 0.0));
  EXPECT_EQ(sum_dy_xhat.to_vector<double>(), std::vector<double>(3, 0.0));
}

// One shard's sums give bn_train_stats's statistics and running statistics.
TEST(SyncBnKernels, GlobalStatsOfOneShardAreBnTrainStats) {
  for (DType dtype : {DType::f32, DType::f64})
    for (MemoryFormat f : kFormats) {
      const Tensor x = input({4, 3, 3, 5}, dtype, f, 2);
      const int64_t C = 3;
      Tensor packed = Tensor::empty({2 * C + 1}, DType::f64);
      k().sync_bn_local_stats(x, packed);
      Tensor rm = Tensor::from_vector<float>({0.5f, -1.0f, 2.0f}, {C}), rv = Tensor::ones({C});
      Tensor rm_ref = rm.clone(), rv_ref = rv.clone();
      const auto [mean, invstd] = k().sync_bn_global_stats(packed, dtype, kEps, kMomentum, rm, rv);
      const auto [mean_ref, invstd_ref] = k().bn_train_stats(x, kEps, kMomentum, rm_ref, rv_ref);
      ASSERT_EQ(mean.dtype(), dtype);
      ASSERT_EQ(invstd.dtype(), dtype);
      // E[x^2] - mean^2 in f64 against two passes: equal to the last bits of f32 (|mean| <= 7 std here).
      const double tol = dtype == DType::f32 ? 2e-7 : 1e-12;
      expect_close(mean, mean_ref, tol, "mean");
      expect_close(invstd, invstd_ref, tol, "invstd");
      expect_close(rm, rm_ref, 2e-7, "running_mean");
      expect_close(rv, rv_ref, 2e-7, "running_var");
    }
}

// Uneven shards: their sums added (what the all-reduce does) give the statistics of the whole batch.
TEST(SyncBnKernels, GlobalStatsOfAddedShardsAreTheWholeBatchs) {
  const Tensor x = input({5, 2, 3, 3}, DType::f64, MemoryFormat::contiguous, 3);
  const int64_t C = 2;
  Tensor a = Tensor::empty({2 * C + 1}, DType::f64), b = Tensor::empty({2 * C + 1}, DType::f64);
  k().sync_bn_local_stats(x.slice(0, 0, 4), a);
  k().sync_bn_local_stats(x.slice(0, 4, 5), b);
  Tensor total = k().binary(BinaryOp::add, a, b);
  EXPECT_EQ(total.to_vector<double>()[2 * C], 45.0);
  Tensor rm = Tensor::zeros({C}, DType::f64), rv = Tensor::ones({C}, DType::f64);
  Tensor rm_ref = rm.clone(), rv_ref = rv.clone();
  const auto [mean, invstd] = k().sync_bn_global_stats(total, DType::f64, kEps, kMomentum, rm, rv);
  const auto [mean_ref, invstd_ref] = k().bn_train_stats(x, kEps, kMomentum, rm_ref, rv_ref);
  expect_close(mean, mean_ref, 1e-13, "mean");
  expect_close(invstd, invstd_ref, 1e-12, "invstd");
  expect_close(rm, rm_ref, 1e-13, "running_mean");
  expect_close(rv, rv_ref, 1e-12, "running_var (unbiased over 45 values)");
}

TEST(SyncBnKernels, LocalGradSumsAreBnBackwardReduceAndPackedOverTheGlobalCount) {
  for (DType dtype : {DType::f32, DType::f64})
    for (MemoryFormat f : kFormats) {
      const Tensor x = input({2, 4, 3, 3}, dtype, f, 4);
      const Tensor dy = input({2, 4, 3, 3}, dtype, f, 5);
      const int64_t C = 4;
      Tensor stats = Tensor::empty({2 * C + 1}, DType::f64);
      k().sync_bn_local_stats(x, stats);
      Tensor rm, rv;
      const auto [mean, invstd] = k().sync_bn_global_stats(stats, dtype, kEps, kMomentum, rm, rv);
      // As if three ranks of this size: the packed sums are divided by the global count 54.
      Tensor global = k().binary_scalar(BinaryOp::mul, stats, 3.0, false);
      Tensor packed = nan_buffer(2 * C);
      const auto [sum_dy, sum_dy_xhat] = k().sync_bn_local_grad_sums(dy, x, mean, invstd, global, packed);
      const auto [sum_dy_ref, sum_dy_xhat_ref] = k().bn_backward_reduce(dy, x, mean, invstd, Tensor());
      ASSERT_EQ(sum_dy.dtype(), dtype);
      const double tol = dtype == DType::f32 ? 2e-7 : 1e-13;
      expect_close(sum_dy, sum_dy_ref, tol, "sum_dy");
      expect_close(sum_dy_xhat, sum_dy_xhat_ref, tol, "sum_dy_xhat");
      std::vector<double> want = sum_dy_ref.to_vector<double>();
      for (double v : sum_dy_xhat_ref.to_vector<double>()) want.push_back(v);
      for (double& v : want) v /= 54.0;
      expect_close(packed.to_vector<double>(), want, tol, "packed means");
    }
}

TEST(SyncBnKernels, RejectsBuffersOfTheWrongSizeOrDtype) {
  const Tensor x = Tensor::ones({2, 3, 2, 2});
  Tensor f32 = Tensor::zeros({7});
  EXPECT_THROW(k().sync_bn_local_stats(x, f32), std::invalid_argument);
  Tensor short_buffer = Tensor::zeros({6}, DType::f64);
  EXPECT_THROW(k().sync_bn_local_stats(x, short_buffer), std::invalid_argument);
  Tensor rm, rv;
  EXPECT_THROW(k().sync_bn_global_stats(short_buffer, DType::f32, kEps, kMomentum, rm, rv),
               std::invalid_argument);
  Tensor ok = Tensor::zeros({7}, DType::f64);
  EXPECT_THROW(k().sync_bn_global_stats(ok, DType::f16, kEps, kMomentum, rm, rv), std::invalid_argument);
  Tensor sums = Tensor::zeros({7}, DType::f64);
  EXPECT_THROW(k().sync_bn_local_grad_sums(x, x, Tensor::zeros({3}), Tensor::ones({3}), ok, sums),
               std::invalid_argument);
}

}  // namespace
}  // namespace trainer
