// `trainer config CONFIG --format toml` prints a config that can be fed back: printing the printout
// gives the same text, and both resolve to the same values (special values keep their spelling).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "app/config/config.h"
#include "trainer_process.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using testing::run_trainer;
using testing::RunResult;

class ConfigTomlFormat : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_cfgtoml_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The printout of `trainer config path --format toml ...`, saved as `name`.
  fs::path print_to(const std::string& path, const std::string& extra, const std::string& name) {
    const RunResult r = run_trainer("config " + path + " --format toml" + extra + " 2>/dev/null");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const fs::path out = dir_ / name;
    std::ofstream(out) << r.output;
    return out;
  }
  fs::path dir_;
};

TEST_F(ConfigTomlFormat, EveryShippedConfigRoundTrips) {
  for (const auto& entry : fs::directory_iterator(TRAINER_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    const fs::path once = print_to(entry.path().string(), "", "once.toml");
    const fs::path twice = print_to(once.string(), "", "twice.toml");
    EXPECT_EQ(testing::read_file(once), testing::read_file(twice));
    EXPECT_TRUE(load_config(entry.path().string()) == load_config(once.string()));
  }
}

TEST_F(ConfigTomlFormat, OverridesAndSpecialValuesSurvive) {
  const std::string shipped = TRAINER_SOURCE_DIR "/configs/imagefolder_resnet50.toml";
  const fs::path once = print_to(shipped, " --set optim.lr=0.05 --set data.workers=-1", "once.toml");
  const std::string text = testing::read_file(once);
  EXPECT_NE(text.find("workers = -1  # auto\n"), std::string::npos) << text;
  EXPECT_NE(text.find("num_classes = 0  # from the dataset\n"), std::string::npos) << text;
  EXPECT_NE(text.find("max_steps = 0  # no limit\n"), std::string::npos) << text;
  EXPECT_NE(text.find("device = \"auto\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find("lr = 0.05\n"), std::string::npos) << text;
  const Config fed_back = load_config(once.string());
  EXPECT_TRUE(load_config(shipped, {"optim.lr=0.05"}) == fed_back);
  EXPECT_EQ(fed_back.data.workers, -1);
  const fs::path twice = print_to(once.string(), "", "twice.toml");
  EXPECT_EQ(text, testing::read_file(twice));
}

TEST_F(ConfigTomlFormat, UnknownFormatIsAUsageError) {
  const RunResult r =
      run_trainer("config " TRAINER_SOURCE_DIR "/configs/fashion_mnist_cnn.toml --format yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--format expects table or toml, got 'yaml'"), std::string::npos) << r.output;
  const RunResult table = run_trainer("config " TRAINER_SOURCE_DIR "/configs/fashion_mnist_cnn.toml");
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("optim.lr"), std::string::npos) << table.output;
}

}  // namespace
}  // namespace trainer
