// The autocast policy's bookkeeping and its cast op, on the CPU. The half-precision ops themselves run
// on the GPU (tests/gpu/autocast_test.cpp); the CPU backend trains in fp32 only.
#include "nn/amp/autocast.h"

#include <gtest/gtest.h>

#include "nn/functional.h"

namespace trainer {
namespace {

TEST(Autocast, ScopesNestAndRestore) {
  EXPECT_FALSE(autocast_dtype());
  {
    AutocastScope outer(DType::bf16);
    EXPECT_EQ(autocast_dtype(), DType::bf16);
    {
      AutocastScope off(std::nullopt);  // e.g. a piece of the forward pass kept in fp32
      EXPECT_FALSE(autocast_dtype());
      AutocastScope inner(DType::f16);
      EXPECT_EQ(autocast_dtype(), DType::f16);
    }
    EXPECT_EQ(autocast_dtype(), DType::bf16);
  }
  EXPECT_FALSE(autocast_dtype());
  EXPECT_THROW(AutocastScope(DType::f32), std::invalid_argument);
  EXPECT_FALSE(autocast_dtype());
}

TEST(Autocast, AppliesToF32AndMixedInputsButNotF64) {
  EXPECT_FALSE(autocast_applies({DType::f32, DType::f32}));  // outside a scope
  AutocastScope scope(DType::bf16);
  EXPECT_TRUE(autocast_applies({DType::f32, DType::f32}));
  EXPECT_TRUE(autocast_applies({DType::bf16, DType::f32}));  // half activations, fp32 master weights
  EXPECT_TRUE(autocast_applies({DType::f16, DType::f16}));   // the other half type is converted
  EXPECT_FALSE(autocast_applies({DType::bf16, DType::bf16}));
  EXPECT_FALSE(autocast_applies({DType::f64, DType::f32}));
}

TEST(ToDtype, GradientComesBackInTheInputsDtype) {
  Tensor x0 = Tensor::from_vector<float>({1.5f, -2.0f, 0.25f, 3.0f, 4.0f, -1.0f, 0.5f, 2.0f}, {1, 2, 2, 2});
  Variable x(x0.contiguous(MemoryFormat::channels_last), true);
  Variable y = F::to_dtype(x, DType::f64, MemoryFormat::contiguous);
  EXPECT_EQ(y.dtype(), DType::f64);
  EXPECT_TRUE(y.data().is_contiguous());
  F::sum(F::mul(y, y)).backward();  // d/dx sum(x^2) = 2x
  const Tensor g = x.grad();
  EXPECT_EQ(g.dtype(), DType::f32);
  EXPECT_EQ(g.contiguous().to_vector<float>(), std::vector<float>({3, -4, 0.5, 6, 8, -2, 1, 4}));
}

TEST(ToDtype, HalfRoundTripRoundsLikePyTorch) {
  // 1 + 2^-9 is not representable in bf16 (8 bits of mantissa): round to nearest even gives 1.
  Variable x(Tensor::from_vector<float>({1.0f + 1.0f / 512, 3.0f}, {2}), true);
  Variable h = F::to_dtype(x, DType::bf16);
  EXPECT_EQ(h.dtype(), DType::bf16);
  EXPECT_EQ(F::to_dtype(h, DType::f32).data().to_vector<float>(), std::vector<float>({1.0f, 3.0f}));
  EXPECT_EQ(F::to_dtype(x, DType::f32).data().raw_data(), x.data().raw_data());  // no-op, no copy
}

}  // namespace
}  // namespace trainer
