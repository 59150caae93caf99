#include "nn/models/mlp.h"

#include <stdexcept>

#include "nn/functional.h"

namespace trainer {

Mlp::Mlp(int64_t in_features, int64_t num_classes, Generator& gen) {
  fc1_ = register_module("fc1", std::make_shared<Linear>(in_features, 256, true, gen));
  fc2_ = register_module("fc2", std::make_shared<Linear>(256, 128, true, gen));
  fc3_ = register_module("fc3", std::make_shared<Linear>(128, num_classes, true, gen));
}

Variable Mlp::forward(const Variable& x) {
  Variable h = F::flatten(x, 1);  // [N, C*H*W]
  if (h.size(1) != fc1_->in_features())
    throw std::invalid_argument("mlp was built for " + std::to_string(fc1_->in_features()) +
                                " input values per sample (in_channels * image_size^2), got input " +
                                shape_str(x.shape()));
  h = F::relu(fc1_->forward(h));
  h = F::relu(fc2_->forward(h));
  return fc3_->forward(h);
}

std::shared_ptr<Module> make_mlp(const ModelOptions& o) {
  if (o.image_size <= 0) throw std::invalid_argument("model 'mlp': image_size must be positive");
  if (o.dropout > 0.0)
    throw std::invalid_argument("model 'mlp' has no dropout; 'cnn' and the ViTs support dropout > 0");
  Generator gen(o.seed);
  return std::make_shared<Mlp>(o.in_channels * o.image_size * o.image_size, o.num_classes, gen);
}

}  // namespace trainer
