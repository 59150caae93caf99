#pragma once
// y = x W^T + b, as torch.nn.Linear: weight [out, in], bias [out].
#include <cstdint>

#include "nn/init.h"
#include "nn/modules/module.h"

namespace trainer {

class Linear : public Module {
 public:
  // Initialised like PyTorch: weight kaiming_uniform(a=sqrt(5)), bias uniform(+-1/sqrt(in)).
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         Generator& gen = init::default_generator());
  Variable forward(const Variable& x) override;  // [..., in] -> [..., out] (PyTorch's rule)
  void reset_parameters(Generator& gen);

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  Variable& weight() { return weight_; }
  Variable& bias() { return bias_; }  // undefined without bias

 private:
  int64_t in_features_, out_features_;
  Variable weight_, bias_;
};

}  // namespace trainer
