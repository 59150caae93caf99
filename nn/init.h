#pragma once
// Weight initialisers with torch.nn.init's semantics (fan computation, gains, bounds), drawing from a
// seeded Generator so that a model's initial weights depend only on its seed.
#include <cstdint>
#include <utility>

#include "nn/random.h"
#include "nn/tensor.h"

namespace trainer::init {

enum class FanMode : uint8_t { fan_in, fan_out };
enum class Nonlinearity : uint8_t { linear, conv2d, sigmoid, tanh, relu, leaky_relu };

// The process-wide generator used by layers constructed without one (torch's default generator).
Generator& default_generator();

// torch.nn.init.calculate_gain; `param` is leaky_relu's negative slope.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);
// {fan_in, fan_out} of a weight [out, in, k...]: in * prod(k), out * prod(k). Needs >= 2 dims.
std::pair<int64_t, int64_t> fan_in_and_fan_out(const Tensor& weight);

void uniform_(Tensor& t, double lo, double hi, Generator& gen);
void normal_(Tensor& t, double mean, double stddev, Generator& gen);
// torch.nn.init.trunc_normal_: normal(mean, stddev) redrawn outside [lo, hi]. The bounds are absolute,
// as torch's are (defaults -2 and 2), not in standard deviations: at torchvision's std 0.02 (ConvNeXt)
// nothing is redrawn in practice. (trainer::trunc_normal_ in nn/random.h cuts at 2 std instead.)
void trunc_normal_(Tensor& t, Generator& gen, double mean, double stddev, double lo = -2.0, double hi = 2.0);
void constant_(Tensor& t, double value);
inline void zeros_(Tensor& t) { constant_(t, 0.0); }
inline void ones_(Tensor& t) { constant_(t, 1.0); }

// He initialisation: std = gain / sqrt(fan), uniform bound = sqrt(3) * std. `a` is the leaky_relu
// slope (torch's default a=0 with leaky_relu equals relu's gain sqrt(2)).
void kaiming_uniform_(Tensor& t, Generator& gen, double a = 0.0, FanMode mode = FanMode::fan_in,
                      Nonlinearity nonlinearity = Nonlinearity::leaky_relu);
void kaiming_normal_(Tensor& t, Generator& gen, double a = 0.0, FanMode mode = FanMode::fan_in,
                     Nonlinearity nonlinearity = Nonlinearity::leaky_relu);
// Glorot initialisation: std = gain * sqrt(2 / (fan_in + fan_out)).
void xavier_uniform_(Tensor& t, Generator& gen, double gain = 1.0);
void xavier_normal_(Tensor& t, Generator& gen, double gain = 1.0);

}  // namespace trainer::init
