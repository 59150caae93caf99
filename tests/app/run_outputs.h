#pragma once
// What a finished `trainer` command wrote, read back: a run stopped and resumed compared with the
// uninterrupted one.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "metrics/run_csv_util.h"
#include "trainer_process.h"

namespace trainer::testing {

// A run stopped and resumed against the uninterrupted run in another run directory: the losses, the
// epoch rows (train_steps.csv, metrics.csv, without their clock columns) and the final weights are the
// same bits.
inline void expect_same_run(const std::filesystem::path& uninterrupted,
                            const std::filesystem::path& resumed) {
  EXPECT_EQ(without_wall_time(read_file(uninterrupted / "train_steps.csv")),
            without_wall_time(read_file(resumed / "train_steps.csv")));
  EXPECT_EQ(without_timing_columns(read_file(uninterrupted / "metrics.csv")),
            without_timing_columns(read_file(resumed / "metrics.csv")));
  EXPECT_EQ(read_file(uninterrupted / "checkpoints/final.safetensors"),
            read_file(resumed / "checkpoints/final.safetensors"));
}

}  // namespace trainer::testing
