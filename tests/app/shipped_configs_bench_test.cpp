// Every shipped config can be benchmarked: `trainer bench CONFIG --steps 3` on synthetic data of the
// config's shape. A short bench run is the first thing many users try on a new machine, and it once
// failed on configs/imagefolder_resnet50.toml (warm-up longer than the run).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "app/config/config.h"
#include "trainer_process.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using testing::run_trainer;
using testing::RunResult;

TEST(ShippedConfigsBench, EveryConfigBenchesThreeSteps) {
  const fs::path out_root = fs::temp_directory_path() / ("trainer_cfgbench_" + std::to_string(::getpid()));
  fs::remove_all(out_root);
  int count = 0;
  for (const auto& entry : fs::directory_iterator(TRAINER_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    // The config's model and schedule as shipped; only the images shrink, to keep this CPU test quick
    // (the bench replaces the dataset by synthetic images of the config's shape).
    // A config that asks for a GPU precision runs here in fp32, the CPU's one precision.
    std::string sets = " --set train.device=cpu --set data.eval_batch_size=64 --set data.workers=1";
    if (load_config(entry.path().string()).train.precision != Precision::fp32) sets += " --precisions fp32";
    if (load_config(entry.path().string()).data.image_size > 32) sets += " --set data.image_size=32";
    // DeiT's repeated-augmentation sampler keeps floor(n / 256) * 256 samples: none of the bench's few.
    if (load_config(entry.path().string()).data.repeated_augmentations > 1)
      sets += " --set data.repeated_augmentations=1";
    const fs::path out = out_root / entry.path().stem();
    const RunResult r = run_trainer("bench " + entry.path().string() +
                                    " --procs 1 --batch 4 --steps 3 --warmup 0 --data synthetic --out " +
                                    out.string() + sets);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(fs::exists(out / "bench.csv")) << r.output;
    ++count;
  }
  EXPECT_GE(count, 5);
  fs::remove_all(out_root);
}

}  // namespace
}  // namespace trainer
