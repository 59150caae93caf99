// `trainer bench-data` run as a user runs it, with tiny sizes: the output's structure, not its speed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "trainer_process.h"

namespace {

namespace fs = std::filesystem;
using trainer::testing::read_file;
using trainer::testing::run_trainer;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

TEST(BenchData, WritesTableCsvAndJsonWithEveryPoint) {
  const fs::path out = fs::temp_directory_path() / ("bench_data_test_" + std::to_string(getpid()));
  fs::remove_all(out);
  const auto r = run_trainer(
      "bench-data --images 6 --jpeg-size 40 --crop 24 --jpeg-batch 4 --cifar-samples 50 "
      "--batches 8,16 --workers 2 --out " +
      out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("images/s/core"), std::string::npos) << r.output;

  // 1 and 2 workers for the JPEG benchmark and for each of the two CIFAR batch sizes.
  const auto csv = lines_of(read_file(out / "loader_bench.csv"));
  ASSERT_EQ(csv.size(), 1u + 2 + 4) << read_file(out / "loader_bench.csv");
  EXPECT_EQ(
      csv[0],
      "benchmark,batch_size,workers,cores_used,images,batches,seconds,images_per_s,images_per_s_per_core,"
      "batches_per_s");
  const std::regex row(
      R"((jpeg_rrc24|cifar_crop_flip),(\d+),([12]),([12]),(\d+),(\d+),[0-9.]+,[0-9.]+,[0-9.]+,[0-9.]+)");
  const std::vector<std::string> expected = {"jpeg_rrc24,4,1",       "jpeg_rrc24,4,2",
                                             "cifar_crop_flip,8,1",  "cifar_crop_flip,8,2",
                                             "cifar_crop_flip,16,1", "cifar_crop_flip,16,2"};
  for (size_t i = 1; i < csv.size(); ++i) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(csv[i], m, row)) << csv[i];
    EXPECT_EQ(csv[i].rfind(expected[i - 1], 0), 0u) << csv[i];
    EXPECT_GE(std::stoll(m[5]), m[1] == "jpeg_rrc24" ? 6 : 50);  // at least one whole epoch
  }

  const nlohmann::json json = nlohmann::json::parse(read_file(out / "loader_bench.json"));
  for (const char* key : {"build", "cpu_cores"})
    EXPECT_TRUE(json.contains(key)) << key << " missing in\n" << json;
  EXPECT_EQ(json.at("jpeg_source"), "generated");
  ASSERT_EQ(json.at("results").size(), 6u) << json;
  for (const nlohmann::json& r : json.at("results"))
    for (const char* key : {"benchmark", "images_per_s_per_core", "batches_per_s"})
      EXPECT_TRUE(r.contains(key)) << key << " missing in\n" << r;
  fs::remove_all(out);
}

// With a cache, each worker count times its first epoch (filling the cache) and its second (reading it).
TEST(BenchData, WithACacheTimesTheFirstAndSecondEpochsApart) {
  const fs::path out = fs::temp_directory_path() / ("bench_data_cache_test_" + std::to_string(getpid()));
  fs::remove_all(out);
  const auto r = run_trainer(
      "bench-data --images 6 --jpeg-size 40 --crop 24 --jpeg-batch 4 --cifar-samples 50 --batches 8 "
      "--workers 2 --cache decoded --cache-bytes 1000000 --out " +
      out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("data.cache = \"decoded\" holds 6 of 6 files"), std::string::npos) << r.output;
  const auto csv = lines_of(read_file(out / "loader_bench.csv"));
  ASSERT_EQ(csv.size(), 1u + 4 + 2) << read_file(out / "loader_bench.csv");
  const std::vector<std::string> expected = {
      "jpeg_rrc24_decoded_epoch1,4,1,", "jpeg_rrc24_decoded_epoch2,4,1,", "jpeg_rrc24_decoded_epoch1,4,2,",
      "jpeg_rrc24_decoded_epoch2,4,2,"};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(csv[i + 1].rfind(expected[i], 0), 0u) << csv[i + 1];
    EXPECT_NE(csv[i + 1].find(",6,2,"), std::string::npos) << "one epoch of 6 images: " << csv[i + 1];
  }
  const nlohmann::json json = nlohmann::json::parse(read_file(out / "loader_bench.json"));
  EXPECT_EQ(json.at("cache"), "decoded");
  fs::remove_all(out);
}

// --cache with --augment: the augmented crops are timed on the cache too (their own fill, then reads),
// beside the plain crops, instead of the augmentation being left out.
TEST(BenchData, WithACacheAndAugmentTimesTheAugmentedCropsOnTheCache) {
  const fs::path out = fs::temp_directory_path() / ("bench_data_cache_aug_test_" + std::to_string(getpid()));
  fs::remove_all(out);
  const auto r = run_trainer(
      "bench-data --images 6 --jpeg-size 40 --crop 24 --jpeg-batch 4 --cifar-samples 50 --batches 8 "
      "--workers 1 --cache decoded --cache-bytes 1000000 --augment trivialaugment --out " +
      out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("jpeg_rrc24_trivialaugment: data.cache = \"decoded\" holds 6 of 6 files"),
            std::string::npos)
      << r.output;
  const auto csv = lines_of(read_file(out / "loader_bench.csv"));
  ASSERT_EQ(csv.size(), 1u + 4 + 1) << read_file(out / "loader_bench.csv");
  const std::vector<std::string> expected = {
      "jpeg_rrc24_decoded_epoch1,4,1,", "jpeg_rrc24_decoded_epoch2,4,1,",
      "jpeg_rrc24_trivialaugment_decoded_epoch1,4,1,", "jpeg_rrc24_trivialaugment_decoded_epoch2,4,1,"};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(csv[i + 1].rfind(expected[i], 0), 0u) << csv[i + 1];
    EXPECT_NE(csv[i + 1].find(",6,2,"), std::string::npos) << "one epoch of 6 images: " << csv[i + 1];
  }
  const nlohmann::json json = nlohmann::json::parse(read_file(out / "loader_bench.json"));
  EXPECT_EQ(json.at("cache"), "decoded");
  EXPECT_EQ(json.at("augment"), "trivialaugment");
  fs::remove_all(out);
}

TEST(BenchData, HelpAndUsageErrors) {
  const auto help = run_trainer("bench-data --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("images/s per core"), std::string::npos) << help.output;
  EXPECT_NE(run_trainer("--help").output.find("bench-data"), std::string::npos);
  EXPECT_EQ(run_trainer("bench-data --batches 0").exit_code, 2);
  EXPECT_EQ(run_trainer("bench-data --frobnicate").exit_code, 2);
  EXPECT_EQ(run_trainer("bench-data --cache hot").exit_code, 2);
}

}  // namespace
