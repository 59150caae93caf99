#pragma once
// The smallest model the app tests train or checkpoint: an MLP on 1x4x4 images, 3 classes.
#include <memory>

#include "nn/models/registry.h"

namespace trainer::testing {

inline std::shared_ptr<Module> tiny_mlp() {
  ModelOptions m;
  m.name = "mlp";
  m.in_channels = 1;
  m.image_size = 4;
  m.num_classes = 3;
  return create_model(m);
}

}  // namespace trainer::testing
