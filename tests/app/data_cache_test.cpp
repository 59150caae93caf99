// data.cache = "encoded" from the config to the datasets: the budget reaches both splits (training
// first), the log line says how much is cached, and a training run with the cache on completes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/run/datasets.h"
#include "data/image_codec.h"
#include "data/image_folder.h"
#include "nn/random.h"
#include "trainer_process.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using testing::run_trainer;
using testing::RunResult;

class DataCache : public testing::TrainerRunTest {
 protected:
  DataCache() : TrainerRunTest("trainer_data_cache_") {}

  // root/train/{a,b}: 6 JPEGs each; root/val/{a,b}: 2 each.
  fs::path write_folder() {
    const fs::path root = dir_ / "images";
    std::vector<uint8_t> pixels(40 * 30 * 3);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 37 % 251);
    const std::vector<uint8_t> jpeg = encode_jpeg(pixels.data(), 40, 30, 3);
    for (const char* cls : {"a", "b"}) {
      for (const char* split : {"train", "val"}) {
        fs::create_directories(root / split / cls);
        for (int i = 0; i < (split[0] == 't' ? 6 : 2); ++i)
          std::ofstream(root / split / cls / (std::to_string(i) + ".jpg"), std::ios::binary)
              .write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size()));
      }
    }
    return root;
  }
};

TEST_F(DataCache, TheBudgetGoesToTheTrainingSplitFirstAndTheLogSaysHowMuchIsCached) {
  Config config;
  config.data.dataset = "image_folder";
  config.data.root = write_folder().string();
  config.data.image_size = 16;
  EXPECT_EQ(data_cache_report(open_datasets(config, 1)), "");  // data.cache = "none"

  config.data.cache = CacheMode::encoded;
  config.data.cache_bytes = 1 << 20;
  const Datasets data = open_datasets(config, 1);
  const auto& train = dynamic_cast<const ImageFolder&>(*data.train);
  const auto& test = dynamic_cast<const ImageFolder&>(*data.test);
  ASSERT_TRUE(train.cache() && test.cache());
  EXPECT_FALSE(train.cache()->shared());  // one rank: nothing to share
  std::vector<uint8_t> pixels(static_cast<size_t>(train.sample_bytes()));
  Generator gen(0);
  for (int64_t i = 0; i < 3; ++i) train.read_augmented(i, pixels.data(), gen);
  const std::string report = data_cache_report(data);
  EXPECT_NE(report.find("data.cache = \"encoded\": training 3 of 12 files"), std::string::npos) << report;
  EXPECT_NE(report.find("; evaluation 0 of 4 files"), std::string::npos) << report;

  // A budget the training split takes whole leaves the evaluation split none.
  config.data.cache_bytes = static_cast<int64_t>(train.listed_bytes());
  const Datasets tight = open_datasets(config, 1);
  EXPECT_EQ(dynamic_cast<const ImageFolder&>(*tight.test).cache(), nullptr);
}

TEST_F(DataCache, DecodedPixelsAreReportedAsSuch) {
  Config config;
  config.data.dataset = "image_folder";
  config.data.root = write_folder().string();
  config.data.image_size = 16;
  config.data.cache = CacheMode::decoded;
  config.data.cache_bytes = 1 << 20;
  const Datasets data = open_datasets(config, 1);
  const auto& train = dynamic_cast<const ImageFolder&>(*data.train);
  EXPECT_EQ(train.cache_mode(), CacheMode::decoded);
  std::vector<uint8_t> pixels(static_cast<size_t>(train.sample_bytes()));
  Generator gen(0);
  for (int64_t i = 0; i < 2; ++i) train.read_augmented(i, pixels.data(), gen);
  const std::string report = data_cache_report(data);
  // 40x30 images, larger than the bound (16 * 256 / 224 = 18), are kept at 24x18: 24 + 1296 bytes each,
  // with 8 of bookkeeping: 2656 bytes for two.
  EXPECT_NE(report.find("data.cache = \"decoded\": training 2 of 12 files, 2.6 KiB"), std::string::npos)
      << report;
  ASSERT_EQ(data_cache_of(data.train.get()), train.cache());
  EXPECT_EQ(data_cache_of(nullptr), nullptr);
}

TEST_F(DataCache, ATrainingRunWithTheCacheCompletes) {
  const fs::path root = write_folder();
  for (const char* mode : {"encoded", "decoded"}) {
    const fs::path config = dir_ / (std::string(mode) + ".toml");
    std::ofstream(config) << "[model]\nname = \"cnn\"\n[data]\ndataset = \"image_folder\"\nroot = \""
                          << root.string()
                          << "\"\nimage_size = 16\nbatch_size = 4\neval_batch_size = 4\ncache = \"" << mode
                          << "\"\ncache_bytes = 1048576\n[train]\nepochs = 2\ndevice = \"cpu\"\n";
    const RunResult run =
        run_trainer("train " + config.string() + " --set train.run_dir=" + run_dir(std::string("r") + mode));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("data.cache = \"" + std::string(mode) + "\": training 12 of 12 files"),
              std::string::npos)
        << run.output;
  }
}

}  // namespace
}  // namespace trainer
