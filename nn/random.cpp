#include "nn/random.h"

#include <cmath>
#include <numbers>
#include <sstream>
#include <vector>

namespace trainer {

uint64_t Generator::below(uint64_t n) {
  // Rejection sampling keeps the result unbiased for any n.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = engine_();
  while (x >= limit);
  return x % n;
}

double Generator::normal() {
  if (has_spare_normal_) {
    has_spare_normal_ = false;
    return spare_normal_;
  }
  double u1;
  do u1 = uniform();
  while (u1 <= 0.0);
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_normal_ = r * std::sin(2.0 * std::numbers::pi * u2);
  has_spare_normal_ = true;
  return r * std::cos(2.0 * std::numbers::pi * u2);
}

std::string Generator::state() const {
  std::ostringstream out;
  out << engine_ << ' ' << has_spare_normal_ << ' ' << std::hexfloat << spare_normal_;
  return out.str();
}

void Generator::set_state(const std::string& state) {
  std::istringstream in(state);
  in >> engine_ >> has_spare_normal_;
  std::string spare;
  in >> spare;
  spare_normal_ = std::strtod(spare.c_str(), nullptr);
  if (in.fail() && !in.eof()) throw std::invalid_argument("Generator::set_state: malformed state");
}

namespace {
template <class Draw> void fill_host(Tensor& t, Draw draw) {
  std::vector<double> values(static_cast<size_t>(t.numel()));
  for (double& v : values) v = draw();
  Tensor host = Tensor::from_vector(values, t.shape());
  t.copy_(host);
}
}  // namespace

void uniform_(Tensor& t, double lo, double hi, Generator& gen) {
  fill_host(t, [&] { return gen.uniform(lo, hi); });
}

void normal_(Tensor& t, double mean, double stddev, Generator& gen) {
  fill_host(t, [&] { return mean + stddev * gen.normal(); });
}

void trunc_normal_(Tensor& t, double mean, double stddev, Generator& gen) {
  fill_host(t, [&] {
    double v;
    do v = gen.normal();
    while (std::abs(v) > 2.0);
    return mean + stddev * v;
  });
}

}  // namespace trainer
