#pragma once
// Dropout as torch.nn.Dropout: in training, zeroes each element with probability p and scales the
// rest by 1/(1-p); identity in evaluation. The masks come from a Generator shared with the owner
// (the trainer saves its state in checkpoints so a resumed run draws the same masks).
#include <memory>

#include "nn/modules/module.h"
#include "nn/random.h"

namespace trainer {

class Dropout : public Module {
 public:
  explicit Dropout(double p, std::shared_ptr<Generator> gen);
  Variable forward(const Variable& x) override;
  double p() const { return p_; }
  const std::shared_ptr<Generator>& generator() const { return gen_; }

 private:
  double p_;
  std::shared_ptr<Generator> gen_;
};

}  // namespace trainer
