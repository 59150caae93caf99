// The op table (tests/op_cases/op_case.h) on the CPU: every Backend virtual is run by a case, and every
// case with a backward matches central finite differences of its forward in float64.
#include <gtest/gtest.h>

#include <algorithm>

#include "op_cases/op_case.h"

namespace trainer::op_cases {
namespace {

TEST(OpTable, EveryBackendVirtualIsRunByACase) {
  const std::vector<std::string> declared = backend_virtuals(TRAINER_SOURCE_DIR "/nn/backend.h");
  ASSERT_GE(declared.size(), 40u) << "nn/backend.h was not parsed";
  const std::vector<std::string> run = virtuals_run_by_cases();
  for (const std::string& name : declared)
    EXPECT_TRUE(std::find(run.begin(), run.end(), name) != run.end())
        << "Backend::" << name << " is run by no case of tests/op_cases/: add one";
  for (const std::string& name : run)
    EXPECT_TRUE(std::find(declared.begin(), declared.end(), name) != declared.end())
        << name << " was recorded but not found in nn/backend.h";
}

TEST(OpTable, CaseNamesAreUnique) {
  std::vector<std::string> names;
  for (const OpCase& c : all_op_cases()) names.push_back(c.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
}

class OpCaseOnCpu : public ::testing::TestWithParam<size_t> {};

TEST_P(OpCaseOnCpu, GradientMatchesFiniteDifferencesInF64) {
  const OpCase c = all_op_cases()[GetParam()];
  if (!c.gradient) GTEST_SKIP() << c.name << ": no backward (checked against the CPU on the GPU suite)";
  const std::string why = check_gradients(c, 11);
  EXPECT_EQ(why, "") << c.name;
}

// The forward in f32 against f64 on the same values: the CPU's own f32 kernels, as the device runs.
TEST_P(OpCaseOnCpu, F32MatchesF64) {
  const OpCase c = all_op_cases()[GetParam()];
  EXPECT_EQ(check_on_device(c, Device::cpu(), DType::f32, MemoryFormat::contiguous, 13), "") << c.name;
}

INSTANTIATE_TEST_SUITE_P(Table, OpCaseOnCpu, ::testing::Range<size_t>(0, all_op_cases().size()),
                         case_test_name);

}  // namespace
}  // namespace trainer::op_cases
