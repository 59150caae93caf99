// The config keys of issue 39's batch recipes: train.loss, [mixup] and data.repeated_augmentations load,
// round-trip through the checkpoint's TOML, and bad values are refused naming the key and where it was set.
#include <gtest/gtest.h>

#include <string>

#include "app/config/config.h"

namespace trainer {
namespace {

std::string error_of(const std::vector<std::string>& overrides) {
  try {
    load_config("", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(MixupConfig, DefaultsAreOffAndValuesLoad) {
  const Config off = load_config("");
  EXPECT_EQ(off.train.loss, LossKind::cross_entropy);
  EXPECT_EQ(off.mixup.mixup_alpha, 0.0);
  EXPECT_EQ(off.mixup.cutmix_alpha, 0.0);
  EXPECT_EQ(off.mixup.prob, 1.0);
  EXPECT_EQ(off.mixup.switch_prob, 0.5);
  EXPECT_EQ(off.data.repeated_augmentations, 1);
  const Config on =
      load_config("", {"train.loss=bce", "mixup.mixup_alpha=0.8", "mixup.cutmix_alpha=1.0", "mixup.prob=0.5",
                       "mixup.switch_prob=0.25", "data.repeated_augmentations=3"});
  EXPECT_EQ(on.train.loss, LossKind::bce);
  EXPECT_EQ(on.mixup.mixup_alpha, 0.8);
  EXPECT_EQ(on.mixup.switch_prob, 0.25);
  EXPECT_EQ(on.data.repeated_augmentations, 3);
  // What a checkpoint stores loads back equal.
  const std::string toml = config_to_toml(on);
  EXPECT_NE(toml.find("[mixup]"), std::string::npos) << toml;
  EXPECT_NE(toml.find("loss = \"bce\""), std::string::npos) << toml;
}

TEST(MixupConfig, BadValuesNameTheKey) {
  EXPECT_NE(error_of({"mixup.prob=1.5"}).find("mixup.prob"), std::string::npos);
  EXPECT_NE(error_of({"mixup.mixup_alpha=-1"}).find("mixup.mixup_alpha"), std::string::npos);
  EXPECT_NE(error_of({"train.loss=focal"}).find("train.loss"), std::string::npos);
  EXPECT_NE(error_of({"data.repeated_augmentations=0"}).find("data.repeated_augmentations"),
            std::string::npos);
  EXPECT_NE(error_of({"mixup.alpha=1"}).find("mixup.alpha"), std::string::npos);  // unknown key
}

}  // namespace
}  // namespace trainer
