// The ConvFeedsBatchNormStats hint (nn/fusion_hints.h): scoped and nestable, and set for exactly the
// convolutions a ResNet follows with a BatchNorm (all of them), not for others.
#include "nn/fusion_hints.h"

#include <gtest/gtest.h>

#include "nn/models/registry.h"
#include "nn/modules/conv.h"

namespace trainer {
namespace {

TEST(ConvFeedsBatchNormStats, IsScopedAndRestoresTheOuterValue) {
  EXPECT_FALSE(ConvFeedsBatchNormStats::active());
  {
    const ConvFeedsBatchNormStats on(true);
    EXPECT_TRUE(ConvFeedsBatchNormStats::active());
    {
      const ConvFeedsBatchNormStats off(false);
      EXPECT_FALSE(ConvFeedsBatchNormStats::active());
    }
    EXPECT_TRUE(ConvFeedsBatchNormStats::active());
  }
  EXPECT_FALSE(ConvFeedsBatchNormStats::active());
}

TEST(ConvFeedsBatchNormStats, EveryResNetConvolutionFeedsABatchNormAndAPlainConvDoesNot) {
  ModelOptions o;
  o.name = "resnet18";
  o.in_channels = 3;
  o.image_size = 32;
  o.num_classes = 10;
  o.stem = "cifar";
  const auto model = create_model(o);
  int convs = 0;
  for (auto& [name, m] : model->named_modules()) {
    if (auto* conv = dynamic_cast<Conv2d*>(m)) {
      ++convs;
      EXPECT_TRUE(conv->feeds_batch_norm()) << name;
    }
  }
  EXPECT_EQ(convs, 20);  // stem, 16 in the blocks, 3 shortcuts
  EXPECT_FALSE(Conv2d(3, 8, 3).feeds_batch_norm());
}

}  // namespace
}  // namespace trainer
