#pragma once
// The fixture of the tests of how `trainer train` and `eval` meet faults (issue 30): a small synthetic
// run (2 epochs of 8 steps, a log line every 4 steps) and helpers to read what it left.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "trainer_process.h"

namespace trainer::testing {

class RunFaults : public TrainerRunTest {
 protected:
  RunFaults() : TrainerRunTest("trainer_faults_") {}

  std::string write_config(const std::string& extra = "") {
    return write_small_config("[train]\nepochs = 2\nlog_every_steps = 4\n[optim]\nlr = 0.05\n" + extra);
  }
  // `trainer train CFG` in run directory `run`, with `env` for the binary and `more` arguments.
  RunResult train(const std::string& cfg, const std::string& run, const std::string& env = "",
                  const std::string& more = "") {
    return run_trainer("train " + cfg + " --set train.run_dir=" + run_dir(run) + more, env);
  }
};

inline size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// Step number -> how many rows of a step CSV have it.
inline std::map<long long, int> step_rows(const std::filesystem::path& csv) {
  std::ifstream in(csv);
  std::string line;
  std::map<long long, int> rows;
  std::getline(in, line);  // header
  while (std::getline(in, line)) ++rows[std::atoll(line.c_str())];
  return rows;
}

inline std::string first_line(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace trainer::testing
