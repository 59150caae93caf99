#pragma once
// The [augment] table as the loader's AugmentConfig (data/augment/augment.h), for the training split.
#include "app/config/config.h"
#include "data/augment/augment.h"

namespace trainer {

AugmentConfig train_augmentation(const Config& config);

}  // namespace trainer
