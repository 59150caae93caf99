#pragma once
// Fine-tuning's starting point: model.pretrained's weights (torchvision's names: a trainer
// final.safetensors or a torchvision state dict saved with safetensors) in a freshly built model.
#include <cstdint>
#include <string>
#include <vector>

#include "nn/modules/module.h"

namespace trainer {

// What load_pretrained did, for the log.
struct PretrainedLoad {
  int64_t copied = 0;                   // tensors taken from the file (resized ones included)
  std::vector<std::string> kept_fresh;  // classifier tensors of another class count, left as initialised
  std::vector<std::string> resized;     // converted by the model (a ViT's position embedding)
  std::vector<std::string> zeroed;      // BatchNorm step counters absent from the file
  std::string summary(const std::string& path) const;
};

// Loads `path` into `model`. As strict as load_module (every tensor of the model in the file with its
// shape, nothing else in the file), except: tensors under `head_prefix` whose shape differs keep the
// model's fresh initialisation (torchvision's weights classify 1000 classes; the run has its own), a
// tensor the model can convert (Module::adapt_loaded_tensor) is converted, floating tensors of another
// dtype are converted, and a missing num_batches_tracked counter is set to 0. Everything is checked
// before anything is copied, so a failure leaves the model as it was; throws std::runtime_error naming
// the tensor.
PretrainedLoad load_pretrained(const std::string& path, Module& model, const std::string& head_prefix);

}  // namespace trainer
