#pragma once
// What a finished `trainer` command printed or wrote, read back: a number in its output, and a run
// stopped and resumed compared with the uninterrupted one.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <string>

#include "metrics/run_csv_util.h"
#include "trainer_process.h"

namespace trainer::testing {

// The number after `marker` in `text` ("1,234" read as 1234): the byte counts of plan's output and of
// the training log; -1 when there is none.
inline long long number_after(const std::string& text, const std::string& marker) {
  const size_t at = text.find(marker);
  if (at == std::string::npos) return -1;
  std::string digits;
  for (size_t i = at + marker.size(); i < text.size() && (std::isdigit(text[i]) || text[i] == ','); ++i)
    if (text[i] != ',') digits += text[i];
  return digits.empty() ? -1 : std::stoll(digits);
}

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
