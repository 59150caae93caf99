#pragma once
// Builds the train and test datasets a config asks for. Data errors about the location are reported
// against the config key that set it (file:line:column: data.root: ...).
#include <memory>

#include "app/config.h"
#include "data/dataset.h"

namespace trainer {

struct Datasets {
  std::shared_ptr<const Dataset> train;
  std::shared_ptr<const Dataset> test;
};

Datasets open_datasets(const Config& config);
// The per-channel statistics the config asks for, else the dataset's own.
Normalization resolved_normalization(const Config& config, const Dataset& dataset);

}  // namespace trainer
