// The op table (tests/op_cases/op_case.h) on the CUDA backend: every case in each of its device
// dtypes, NCHW and (where it says so) channels-last, against the CPU backend in f64 on the same values.
#include <gtest/gtest.h>

#include "op_cases/op_case.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer::op_cases {
namespace {

class OpCaseOnCuda : public ::testing::TestWithParam<size_t> {};

TEST_P(OpCaseOnCuda, MatchesTheCpu) {
  REQUIRE_GPU();
  const OpCase c = all_op_cases()[GetParam()];
  for (DType dtype : c.device_dtypes)
    for (MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
      if (format == MemoryFormat::channels_last && !c.channels_last) continue;
      EXPECT_EQ(check_on_device(c, gpu_test::gpu(), dtype, format, 17), "") << c.name;
    }
}

INSTANTIATE_TEST_SUITE_P(Table, OpCaseOnCuda, ::testing::Range<size_t>(0, all_op_cases().size()),
                         case_test_name);

}  // namespace
}  // namespace trainer::op_cases
