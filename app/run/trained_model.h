#pragma once
// A trained model ready for inference, rebuilt from its config and weights file: what `trainer predict`
// and `trainer export` start from. With a model card in the weights (app/run/model_card.h) nothing of
// the training data is needed; weights without one (written before cards existed, or foreign) take
// the model's shape and transform from the config's dataset, which must then be present, and have no
// class names.
#include <memory>
#include <string>

#include "app/config/config.h"
#include "app/run/checkpoint.h"
#include "app/run/device_setup.h"
#include "app/run/model_card.h"
#include "nn/models/registry.h"
#include "nn/modules/module.h"

namespace trainer {

struct TrainedModel {
  std::shared_ptr<Module> model;  // on the device, in eval mode, weights loaded
  ModelOptions options;           // what create_model built it from
  ModelCard card;                 // class_names empty when the weights carry no card
  // "" when the weights carry a card; else why predictions show class indices.
  std::string no_card_reason;
  std::string weights_note;  // load_weights' line: what was (not) verified
};

// local_world_size: the ranks sharing this node (for the data cache of a dataset opened without a card).
TrainedModel load_trained_model(const Config& config, const std::string& weights_path,
                                const RunDevice& device, CrcCheck crc_check, int local_world_size = 1);

}  // namespace trainer
