#pragma once
// Central finite-difference gradient check in double precision. For an op f(inputs) the scalar
// L = sum(f(inputs) * R) with a fixed random R is differentiated analytically (backward with R as
// the seed) and numerically (dL/dx_i ~ (L(x_i + h) - L(x_i - h)) / 2h) for every element of every
// input that requires a gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "nn/autograd/variable.h"
#include "nn/random.h"

namespace trainer::testing {

// A random f64 tensor with values in [lo, hi).
inline Tensor random_tensor(const Shape& shape, Generator& gen, double lo = -1.0, double hi = 1.0) {
  Tensor t = Tensor::empty(shape, DType::f64);
  uniform_(t, lo, hi, gen);
  return t;
}

// A random f64 leaf that requires a gradient, values in [lo, hi).
inline Variable random_leaf(const Shape& shape, Generator& gen, double lo = -1.0, double hi = 1.0) {
  return Variable(random_tensor(shape, gen, lo, hi), true);
}

inline double dot(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

struct GradcheckResult {
  double max_rel_error = 0.0;
  std::string worst;  // which input and element
};

// Returns the largest relative error |analytic - numeric| / max(1, |analytic|, |numeric|) over all
// elements. `inputs` must be f64 leaves; those with requires_grad are checked.
inline GradcheckResult gradcheck(const std::function<Variable(const std::vector<Variable>&)>& f,
                                 std::vector<Variable> inputs, double h = 1e-6, uint64_t seed = 7) {
  Generator gen(seed);
  for (Variable& v : inputs) v.zero_grad();
  Variable out = f(inputs);
  Tensor r = random_tensor(out.shape(), gen);
  out.backward(r);

  GradcheckResult result;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].requires_grad()) continue;
    Tensor x = inputs[k].data();
    if (x.dtype() != DType::f64 || !x.is_contiguous())
      throw std::invalid_argument("gradcheck: f64 contiguous inputs");
    const Tensor analytic = inputs[k].grad();
    if (!analytic.defined())
      throw std::logic_error("gradcheck: input " + std::to_string(k) + " got no gradient");
    const std::vector<double> ga = analytic.to_vector<double>();
    double* px = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double saved = px[i];
      double lp, lm;
      {
        NoGradGuard ng;
        px[i] = saved + h;
        lp = dot(f(inputs).data(), r);
        px[i] = saved - h;
        lm = dot(f(inputs).data(), r);
        px[i] = saved;
      }
      const double numeric = (lp - lm) / (2 * h);
      const double err = std::abs(ga[i] - numeric) / std::max({1.0, std::abs(ga[i]), std::abs(numeric)});
      if (err > result.max_rel_error) {
        result.max_rel_error = err;
        result.worst = "input " + std::to_string(k) + " element " + std::to_string(i) + ": analytic " +
                       std::to_string(ga[i]) + " numeric " + std::to_string(numeric);
      }
    }
  }
  return result;
}

// gtest helper: EXPECT_GRADCHECK(f, inputs) asserts max relative error < 1e-6.
#define EXPECT_GRADCHECK(f, ...)                                    \
  do {                                                              \
    const auto _gc = ::trainer::testing::gradcheck(f, __VA_ARGS__); \
    EXPECT_LT(_gc.max_rel_error, 1e-6) << "worst: " << _gc.worst;   \
  } while (0)

}  // namespace trainer::testing
