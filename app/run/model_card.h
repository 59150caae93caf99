#pragma once
// What a user of trained weights needs besides the tensors: the class names in label order and the
// evaluation transform (the images' size, channels and normalisation). Every checkpoint carries it:
// in the safetensors metadata of final.safetensors and of each checkpoint's model.safetensors
// ("trainer.class_names", "trainer.eval_transform", JSON text), and in the checkpoint manifest's
// [model_card] table. Files written before it existed have none: `trainer predict` then prints class
// indices and `trainer export` takes the transform from the config's dataset.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "data/dataset.h"
#include "nn/safetensors.h"

namespace trainer {

struct Experiment;

// torchvision's evaluation transform: Resize(resize) of the shorter side, CenterCrop(crop), ToTensor,
// Normalize(mean, std). For datasets stored at the model's size (Fashion-MNIST, CIFAR) resize = crop.
struct EvalTransform {
  int64_t resize = 0;
  int64_t crop = 0;              // the model's input height and width
  int64_t channels = 0;          // 1 (grey) or 3 (RGB): images are converted to it
  std::vector<float> mean, std;  // per channel of pixels scaled to [0, 1]; one value covers all
  bool operator==(const EvalTransform&) const = default;
};

struct ModelCard {
  std::vector<std::string> class_names;  // label order; its size is the model's class count
  EvalTransform transform;
  bool operator==(const ModelCard&) const = default;
};

// The card of a run: the evaluation split's class names and transform, the normalisation the run uses.
ModelCard model_card_of(const Dataset& eval_split, const Normalization& normalization);
ModelCard model_card_of(const Experiment& experiment);

// As safetensors metadata (two keys), and back: none when the file has neither key (written before
// cards existed); a malformed card throws std::runtime_error naming `where` and the key.
SafetensorsMetadata model_card_metadata(const ModelCard& card);
std::optional<ModelCard> model_card_from_metadata(const SafetensorsMetadata& metadata,
                                                  const std::string& where);

// The card stored with a weights file: its own metadata, else the manifest (checkpoint.toml) of the
// checkpoint directory it sits in. None for a file without one (older, or foreign: torchvision's).
std::optional<ModelCard> read_model_card(const std::string& weights_path);
// The same for a weights file already read (read_safetensors): only the manifest is read, if needed.
std::optional<ModelCard> read_model_card(const SafetensorsFile& weights);

}  // namespace trainer
