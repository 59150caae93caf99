// The [augment] table: its keys read into the loader's AugmentConfig, and every bad value reported at
// its file:line:column with the key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "app/config/config.h"
#include "app/run/augmentation.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

class AugmentConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_augment_config_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& text) {
    const std::string path = (dir_ / "a.toml").string();
    std::ofstream(path) << text;
    return path;
  }

  std::string error_of(const std::string& text) {
    const std::string path = write(text);
    try {
      load_config(path);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  }

  fs::path dir_;
};

TEST_F(AugmentConfigTest, DefaultsAugmentNothing) {
  const Config config = load_config("");
  EXPECT_FALSE(train_augmentation(config).enabled());
}

TEST_F(AugmentConfigTest, KeysReachTheLoader) {
  const Config config = load_config(
      write("[augment]\npolicy = \"randaugment\"\nrandaugment_ops = 3\nrandaugment_magnitude = 12\n"
            "color_jitter = [0.4, 0.3, 0.2, 0.1]\nrandom_erasing = 0.25\nerasing_scale = [0.05, 0.5]\n"
            "erasing_ratio = [0.5, 2.0]\nerasing_value = \"random\"\n"));
  const AugmentConfig a = train_augmentation(config);
  EXPECT_EQ(a.policy, AugmentPolicy::randaugment);
  EXPECT_EQ(a.randaugment_ops, 3);
  EXPECT_EQ(a.randaugment_magnitude, 12);
  EXPECT_EQ(a.magnitude_bins, 31);
  EXPECT_EQ(a.color_jitter, (ColorJitterConfig{0.4, 0.3, 0.2, 0.1}));
  EXPECT_EQ(a.erasing.probability, 0.25);
  EXPECT_EQ(a.erasing.scale_min, 0.05);
  EXPECT_EQ(a.erasing.scale_max, 0.5);
  EXPECT_EQ(a.erasing.ratio_min, 0.5);
  EXPECT_EQ(a.erasing.ratio_max, 2.0);
  EXPECT_EQ(a.erasing.value, ErasingValue::random);
  // --set reaches it too, and the resolved TOML reads back equal.
  const Config overridden = load_config("", {"augment.policy=trivialaugment", "augment.random_erasing=0.5"});
  EXPECT_EQ(train_augmentation(overridden).policy, AugmentPolicy::trivialaugment);
  EXPECT_EQ(load_config(write(config_to_toml(config))), config);
}

TEST_F(AugmentConfigTest, BadValuesNameTheirPosition) {
  const std::string path = (dir_ / "a.toml").string();
  EXPECT_NE(error_of("[augment]\npolicy = \"randaug\"\n")
                .find(path + ":2:10: augment.policy: must be one of \"none\", \"randaugment\", "
                             "\"trivialaugment\", \"autoaugment\""),
            std::string::npos);
  EXPECT_NE(
      error_of("[augment]\nrandaugment_magnitude = 31\n")
          .find(path + ":2:25: augment.randaugment_magnitude: must be < augment.magnitude_bins (31), got 31"),
      std::string::npos);
  EXPECT_NE(error_of("[augment]\ncolor_jitter = [0.4, 0.4, 0.4]\n")
                .find(path + ":2:16: augment.color_jitter: must be [] (off) or [brightness, contrast, "
                             "saturation, hue], got 3 values"),
            std::string::npos);
  EXPECT_NE(error_of("[augment]\ncolor_jitter = [0.4, 0.4, 0.4, 0.6]\n")
                .find(path + ":2:16: augment.color_jitter: hue (the 4th value) must be <= 0.5, got 0.6"),
            std::string::npos);
  EXPECT_NE(error_of("[augment]\nrandom_erasing = 1.5\n")
                .find(path + ":2:18: augment.random_erasing: must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(
      error_of("[augment]\nerasing_scale = [0.4, 0.1]\n")
          .find(path + ":2:17: augment.erasing_scale: must be [min, max] with min <= max, got [0.4, 0.1]"),
      std::string::npos);
  EXPECT_NE(error_of("[augment]\nerasing_ratio = [0, 2]\n")
                .find(path + ":2:18: augment.erasing_ratio[0]: must be > 0"),
            std::string::npos);
  EXPECT_NE(error_of("[augment]\nerasing_value = 0\n").find(path + ":2:17: augment.erasing_value"),
            std::string::npos);
}

}  // namespace
}  // namespace trainer
