#pragma once
// Helpers of the GPU suite: every test runs an op on the CPU backend and on the CUDA backend with the
// same inputs and compares. Tests skip (and CI, which has no GPU, passes) when no device is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nn/backend.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/models/registry.h"
#include "nn/random.h"
#include "nn/tensor.h"

namespace trainer::gpu_test {

#define REQUIRE_GPU()                                                          \
  do {                                                                         \
    if (::trainer::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
    ::trainer::init_cuda_backend(0);                                           \
  } while (0)

inline Device gpu() { return Device::cuda(0); }
inline Backend& cpu() { return cpu_backend(); }
inline Backend& dev() { return backend_for(gpu()); }

// Uniform values in [lo, hi) drawn on the host (as f64, then converted), so CPU and GPU copies agree.
inline Tensor random(const Shape& shape, Generator& gen, DType dtype = DType::f32, double lo = -1.0,
                     double hi = 1.0) {
  Tensor t = Tensor::empty(shape, DType::f64);
  uniform_(t, lo, hi, gen);
  return t.to(dtype);
}

inline Tensor on_gpu(const Tensor& t, MemoryFormat format = MemoryFormat::contiguous) {
  Tensor g = Tensor::empty(t.shape(), t.dtype(), gpu(), format);
  g.copy_(t);
  return g;
}

// A model on the GPU in training mode, 10 classes, no dropout (so two runs draw nothing at random).
inline std::shared_ptr<Module> gpu_model(const std::string& name, int channels, int image,
                                         const std::string& stem, uint64_t seed) {
  ModelOptions o;
  o.name = name;
  o.in_channels = channels;
  o.image_size = image;
  o.num_classes = 10;
  o.stem = stem;
  o.seed = seed;
  o.dropout = 0.0;
  auto model = create_model(o);
  model->to(gpu());
  model->train();
  return model;
}

// The values of a half tensor as f32 (what the CPU reference computes on).
inline Tensor as_f32(const Tensor& t) { return t.to(Device::cpu()).to(DType::f32); }

// |actual - expected| <= atol + rtol * |expected| elementwise (NaNs must match NaNs).
inline void expect_close(const Tensor& expected, const Tensor& actual, double rtol, double atol,
                         const std::string& what = "") {
  ASSERT_EQ(expected.shape(), actual.shape()) << what;
  const std::vector<double> e = expected.to_vector<double>(), a = actual.to_vector<double>();
  int bad = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    const bool ok =
        std::isnan(e[i]) ? std::isnan(a[i]) : std::abs(a[i] - e[i]) <= atol + rtol * std::abs(e[i]);
    if (!ok && ++bad <= 5)
      ADD_FAILURE() << what << ": element " << i << " expected " << e[i] << " got " << a[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << e.size() << " elements differ";
}

// |a - e| within rtol of the largest |e|, elementwise: a device result against an f32 reference (a
// half-precision one on the same rounded inputs) whose small elements carry no tighter bound.
inline void expect_near_scale(const Tensor& expected, const Tensor& actual, double rtol,
                              const std::string& what) {
  ASSERT_EQ(expected.shape(), actual.shape()) << what;
  const std::vector<double> e = expected.contiguous().to_vector<double>(),
                            a = actual.contiguous().to_vector<double>();
  double scale = 0.0, diff = 0.0;
  for (size_t i = 0; i < e.size(); ++i) {
    scale = std::max(scale, std::fabs(e[i]));
    diff = std::max(diff, std::fabs(a[i] - e[i]));
  }
  EXPECT_LE(diff, rtol * scale) << what << ": largest difference " << diff << ", scale " << scale;
  EXPECT_GT(scale, 0.0) << what;
}

// ||actual - expected|| / ||expected|| over all elements (any devices, dtypes and layouts).
inline double relative_error(const Tensor& actual, const Tensor& expected) {
  const std::vector<double> a = actual.to(Device::cpu()).to_vector<double>(),
                            e = expected.to(Device::cpu()).to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - e[i]) * (a[i] - e[i]), den += e[i] * e[i];
  return std::sqrt(num / std::max(den, 1e-30));
}

inline double norm(const Tensor& t) {
  double s = 0;
  for (double v : t.to(Device::cpu()).to_vector<double>()) s += v * v;
  return std::sqrt(s);
}

inline void expect_equal(const Tensor& expected, const Tensor& actual, const std::string& what = "") {
  expect_close(expected, actual, 0.0, 0.0, what);
}

}  // namespace trainer::gpu_test
