#pragma once
// A seeded random generator whose sequence is the same on every platform and compiler (the standard
// library's distributions are implementation-defined, so uniform and normal are computed here).
// Its state serialises to a string so checkpoints can restore it exactly.
#include <cstdint>
#include <random>
#include <string>

#include "nn/tensor.h"

namespace trainer {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : engine_(seed) {}
  void seed(uint64_t s) {
    engine_.seed(s);
    has_spare_normal_ = false;
  }
  uint64_t next_u64() { return engine_(); }
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Integer in [0, n).
  uint64_t below(uint64_t n);
  double normal();  // standard normal, Box-Muller
  std::string state() const;
  void set_state(const std::string& state);

 private:
  std::mt19937_64 engine_;
  bool has_spare_normal_ = false;
  double spare_normal_ = 0.0;
};

// In-place initialisers for host or device tensors (values are drawn on the host in element order).
void uniform_(Tensor& t, double lo, double hi, Generator& gen);
void normal_(Tensor& t, double mean, double stddev, Generator& gen);
// Normal truncated to [mean - 2 std, mean + 2 std] by redrawing. (torch.nn.init.trunc_normal_ cuts at
// absolute bounds instead: init::trunc_normal_ in nn/init.h is that one.)
void trunc_normal_(Tensor& t, double mean, double stddev, Generator& gen);

}  // namespace trainer
