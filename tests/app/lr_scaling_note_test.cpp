// The seed guides' "new_lr = base_lr x num_gpus": a run whose global batch is larger than
// data.batch_size (several ranks, or accumulated micro-batches) with optim.lr used as given gets a
// note with the rule's key, since a user moving from one GPU may have forgotten; no note otherwise.
#include <gtest/gtest.h>

#include <string>

#include "app/config/config.h"
#include "app/train/run_start.h"

namespace trainer {
namespace {

TEST(LrScalingNote, OnlyWhenTheGlobalBatchGrowsAndTheLrIsUsedAsGiven) {
  Config c;
  c.data.batch_size = 32;
  c.optim.lr = 0.05;
  EXPECT_EQ(lr_scaling_note(c, 1), "");
  const std::string two = lr_scaling_note(c, 2);
  EXPECT_NE(two.find("optim.lr = 0.05 is used as given for a global batch of 64 (2 rank(s) x batch 32 x 1"),
            std::string::npos)
      << two;
  EXPECT_NE(two.find("optim.lr_scaling = \"linear\""), std::string::npos) << two;
  c.train.grad_accum_steps = 4;
  EXPECT_NE(lr_scaling_note(c, 1).find("global batch of 128 (1 rank(s) x batch 32 x 4"), std::string::npos);
  c.optim.lr_scaling = LrScaling::linear;
  EXPECT_EQ(lr_scaling_note(c, 2), "");
}

}  // namespace
}  // namespace trainer
