// The command line behaves alike across commands: usage errors exit 2 (a --set without '=' too), and
// "--flag=value" works wherever "--flag value" does (bench-data included).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "app/common/cli.h"
#include "trainer_process.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using testing::run_trainer;
using testing::RunResult;

const std::string kConfig = TRAINER_SOURCE_DIR "/configs/fashion_mnist_cnn.toml";

TEST(CliConsistency, SetWithoutEqualsIsAUsageErrorInEveryCommand) {
  for (const std::string& command :
       {"config " + kConfig, "train " + kConfig, "eval " + kConfig + " --weights w.safetensors",
        "bench " + kConfig + " --procs 1", "plan " + kConfig + " --procs 2", "doctor " + kConfig}) {
    SCOPED_TRACE(command);
    const RunResult r = run_trainer(command + " --set foo");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("--set expects section.key=value"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("'foo'"), std::string::npos) << r.output;
  }
  EXPECT_EQ(run_trainer("config " + kConfig + " --set=foo").exit_code, 2);
  EXPECT_EQ(run_trainer("config " + kConfig + " --set =1").exit_code, 2);
}

TEST(CliConsistency, SetOverrideKeepsAValidOverride) {
  EXPECT_EQ(set_override("optim.lr=0.05"), "optim.lr=0.05");
  EXPECT_EQ(set_override("data.root=a=b"), "data.root=a=b");
  EXPECT_THROW(set_override("optim.lr"), UsageError);
}

TEST(CliConsistency, BenchDataTakesFlagEqualsValue) {
  const fs::path out = fs::temp_directory_path() / ("cli_bench_data_" + std::to_string(::getpid()));
  fs::remove_all(out);
  const RunResult r = run_trainer(
      "bench-data --images=4 --jpeg-size=32 --crop=16 --jpeg-batch=2 --cifar-samples=20 --batches=8 "
      "--workers=1 --out=" +
      out.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out / "loader_bench.csv")) << r.output;
  fs::remove_all(out);
  EXPECT_EQ(run_trainer("bench-data --images=0").exit_code, 2);
  EXPECT_EQ(run_trainer("bench-data --out").exit_code, 2);  // no value
}

}  // namespace
}  // namespace trainer
