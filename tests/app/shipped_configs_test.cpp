// Every config this repository ships must load: a typo in a shipped config is a bug users hit first.
#include <gtest/gtest.h>

#include <filesystem>

#include "app/config/config.h"

namespace trainer {
namespace {

TEST(ShippedConfigs, EveryConfigLoads) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(TRAINER_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(load_config(entry.path().string())) << entry.path();
    ++count;
  }
  EXPECT_GE(count, 3);
}

}  // namespace
}  // namespace trainer
