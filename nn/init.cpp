#include "nn/init.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer::init {

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::linear:
    case Nonlinearity::conv2d:
    case Nonlinearity::sigmoid:
      return 1.0;
    case Nonlinearity::tanh:
      return 5.0 / 3.0;
    case Nonlinearity::relu:
      return std::sqrt(2.0);
    case Nonlinearity::leaky_relu:
      return std::sqrt(2.0 / (1.0 + param * param));
  }
  return 1.0;
}

std::pair<int64_t, int64_t> fan_in_and_fan_out(const Tensor& weight) {
  if (weight.dim() < 2)
    throw std::invalid_argument("fan in and fan out need a tensor of at least 2 dims, got " +
                                shape_str(weight.shape()));
  int64_t receptive = 1;
  for (int d = 2; d < weight.dim(); ++d) receptive *= weight.size(d);
  return {weight.size(1) * receptive, weight.size(0) * receptive};
}

void uniform_(Tensor& t, double lo, double hi, Generator& gen) { trainer::uniform_(t, lo, hi, gen); }
void normal_(Tensor& t, double mean, double stddev, Generator& gen) {
  trainer::normal_(t, mean, stddev, gen);
}
void trunc_normal_(Tensor& t, Generator& gen, double mean, double stddev, double lo, double hi) {
  if (!(lo < hi) || !(mean - 3 * stddev < hi && mean + 3 * stddev > lo))
    throw std::invalid_argument("trunc_normal_: [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                "] must be an interval where normal(" + std::to_string(mean) + ", " +
                                std::to_string(stddev) + ") has mass");
  std::vector<double> values(static_cast<size_t>(t.numel()));
  for (double& v : values) {
    do v = mean + stddev * gen.normal();
    while (v < lo || v > hi);
  }
  t.copy_(Tensor::from_vector(values, t.shape()));
}
void constant_(Tensor& t, double value) { t.fill_(value); }

namespace {
double kaiming_std(const Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity) {
  const auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  const int64_t fan = mode == FanMode::fan_in ? fan_in : fan_out;
  if (fan == 0)
    throw std::invalid_argument("kaiming init of a tensor with zero fan: " + shape_str(t.shape()));
  return calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan));
}
}  // namespace

void kaiming_uniform_(Tensor& t, Generator& gen, double a, FanMode mode, Nonlinearity nonlinearity) {
  const double bound = std::sqrt(3.0) * kaiming_std(t, a, mode, nonlinearity);
  trainer::uniform_(t, -bound, bound, gen);
}

void kaiming_normal_(Tensor& t, Generator& gen, double a, FanMode mode, Nonlinearity nonlinearity) {
  trainer::normal_(t, 0.0, kaiming_std(t, a, mode, nonlinearity), gen);
}

void xavier_uniform_(Tensor& t, Generator& gen, double gain) {
  const auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  trainer::uniform_(t, -bound, bound, gen);
}

void xavier_normal_(Tensor& t, Generator& gen, double gain) {
  const auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  trainer::normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), gen);
}

}  // namespace trainer::init
