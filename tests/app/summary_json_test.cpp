// The JSON the trainer writes for scripts (summary.json, the strings of the bench records) and how
// `trainer bench` reads summary.json back: standard JSON, numbers in full, bad files named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "app/commands/bench/bench_runs.h"
#include "app/train/summary.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

RunSummary example_summary() {
  RunSummary s;
  s.epochs = 3;
  s.steps = 1234567890123;
  s.world_size = 8;
  s.train_seconds = 123.45678901234567;
  s.samples_per_second = 1.0 / 3.0;
  s.final_test_accuracy = 0.91234567891234;
  s.best_test_accuracy = 0.9876543210987654;
  s.final_test_top5 = 1.0;
  s.final_test_loss = std::numeric_limits<double>::quiet_NaN();  // no evaluation ran
  s.final_train_loss = 1e-300;
  s.run_dir = "runs/a \"quoted\" \\ dir\n\x01 \xc3\xa9";
  s.weights = "w\xff.safetensors";  // not UTF-8
  return s;
}

TEST(SummaryJson, IsStandardJsonWithEveryNumberInFull) {
  const RunSummary s = example_summary();
  const std::string text = summary_json(s);
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << text;
  EXPECT_EQ(j.at("epochs"), 3);
  EXPECT_EQ(j.at("steps"), 1234567890123);
  EXPECT_EQ(j.at("world_size"), 8);
  EXPECT_EQ(j.at("train_seconds").get<double>(), s.train_seconds);
  EXPECT_EQ(j.at("samples_per_second").get<double>(), s.samples_per_second);
  EXPECT_EQ(j.at("final_test_accuracy").get<double>(), s.final_test_accuracy);
  EXPECT_EQ(j.at("best_test_accuracy").get<double>(), s.best_test_accuracy);
  EXPECT_EQ(j.at("final_test_top5").get<double>(), 1.0);
  EXPECT_TRUE(j.at("final_test_loss").is_null());  // NaN has no JSON literal
  EXPECT_EQ(j.at("final_train_loss").get<double>(), 1e-300);
  EXPECT_EQ(j.at("run_dir"), s.run_dir);
  EXPECT_EQ(j.at("weights"), "w\xef\xbf\xbd.safetensors");  // the stray byte as U+FFFD
  // One key a line, as scripts grep it.
  EXPECT_NE(text.find("\n  \"world_size\": 8,\n"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');
}

class SummaryNumber : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trainer_summary_number_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& text) {
    const fs::path p = dir_ / "summary.json";
    std::ofstream(p) << text;
    return p;
  }

  // The error of reading `key` from a summary with this text, which must throw.
  std::string error_reading(const std::string& text, const std::string& key) {
    const fs::path p = write(text);
    try {
      bench::summary_number(p, key);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    ADD_FAILURE() << "reading " << key << " from " << text << " did not throw";
    return "";
  }

  fs::path dir_;
};

TEST_F(SummaryNumber, ReadsWhatTheTrainerWrites) {
  const RunSummary s = example_summary();
  const fs::path p = write(summary_json(s));
  EXPECT_EQ(bench::summary_number(p, "epochs"), 3.0);
  EXPECT_EQ(bench::summary_number(p, "best_test_accuracy"), s.best_test_accuracy);
  EXPECT_EQ(bench::summary_number(p, "train_seconds"), s.train_seconds);
  EXPECT_TRUE(std::isnan(bench::summary_number(p, "final_test_loss")));
}

TEST_F(SummaryNumber, KeysAreMatchedAsKeysNotAsText) {
  // The key's text inside a string value, and keys in another order and spacing.
  const fs::path p = write(R"({"run_dir": "x\",\"epochs\":7,\"", "weights":"\"epochs\":9",)"
                           "\n\t\"epochs\"\n:\n 2 }");
  EXPECT_EQ(bench::summary_number(p, "epochs"), 2.0);
}

TEST_F(SummaryNumber, BadSummariesAreErrorsNamingTheFile) {
  struct Case {
    const char* text;
    const char* says;
  };
  const Case cases[] = {
      {R"({"epochs": 3, "train_seconds": )", "not valid JSON"},  // the run died while writing it
      {R"({"epochs": "3"})", "\"epochs\" is \"3\", not a number"},
      {R"({"epochs": [3]})", "not a number"},
      {R"({"steps": 3})", "has no \"epochs\""},
      {R"([{"epochs": 3}])", "has no \"epochs\""},
      {"", "not valid JSON"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_reading(c.text, "epochs");
    EXPECT_NE(msg.find((dir_ / "summary.json").string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.says), std::string::npos) << c.text << ": " << msg;
  }
  EXPECT_THROW(bench::summary_number(dir_ / "missing.json", "epochs"), std::runtime_error);
}

}  // namespace
}  // namespace trainer
