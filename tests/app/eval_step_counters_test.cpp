// `trainer eval` of weights without BatchNorm's num_batches_tracked (as torchvision exports them):
// they load, with one note for all the counters set to 0.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "nn/safetensors.h"
#include "trainer_process.h"

namespace trainer {
namespace {

using testing::run_trainer;
using testing::RunResult;

class EvalStepCounters : public testing::TrainerRunTest {
 protected:
  EvalStepCounters() : TrainerRunTest("trainer_eval_counters_") {}
};

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(EvalStepCounters, WeightsWithoutStepCountersLoadWithOneNote) {
  const std::string cfg = write_small_config("[train]\nmax_steps = 2\n");
  const RunResult trained = run_trainer("train " + cfg + " --set train.run_dir=" + run_dir("a"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string weights = run_dir("a") + "/checkpoints/final.safetensors";
  std::vector<std::pair<std::string, Tensor>> kept;
  for (auto& [name, t] : load_safetensors(weights))
    if (!name.ends_with("num_batches_tracked")) kept.emplace_back(name, t);
  const std::string exported = (dir_ / "torchvision_like.safetensors").string();
  save_safetensors(exported, kept);
  const RunResult e = run_trainer("eval " + cfg + " --weights " + exported);
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_EQ(count_of(e.output, "counter(s) missing"), 1u) << e.output;  // one line for all of them
  EXPECT_NE(e.output.find("note: " + exported + ": 2 BatchNorm num_batches_tracked counter(s) missing"),
            std::string::npos)
      << e.output;
}

}  // namespace
}  // namespace trainer
