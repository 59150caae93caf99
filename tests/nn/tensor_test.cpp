#include "nn/tensor.h"

#include <gtest/gtest.h>

#include <cmath>

#include "nn/backend.h"

namespace trainer {
namespace {

TEST(Tensor, FactoriesShapesAndStrides) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(Tensor::full({2}, 3.5).to_vector<float>(), (std::vector<float>{3.5f, 3.5f}));
  EXPECT_THROW(Tensor::empty({-1}), std::invalid_argument);
}

TEST(Tensor, DtypeSizesAndConversions) {
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f})
    EXPECT_EQ(half_to_float(float_to_half(v)), v);
  EXPECT_EQ(float_to_half(1e6f), 0x7c00);  // overflow to inf
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(1.0f)), 1.0f);
  EXPECT_EQ(float_to_bfloat16(1.00390625f), 0x3f80);  // ties round to even
  Tensor f = Tensor::from_vector<float>({1.5f, -2.0f, 3.25f}, {3});
  EXPECT_EQ(f.to(DType::bf16).to(DType::f32).to_vector<float>(), f.to_vector<float>());
  EXPECT_EQ(f.to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{1, -2, 3}));
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor r = t.reshape({3, 2});
  EXPECT_TRUE(r.same_storage(t));
  Tensor p = t.permute({1, 0});
  EXPECT_EQ(p.shape(), (Shape{3, 2}));
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_EQ(p.contiguous().to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor s = t.slice(1, 1, 3);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 2, 4, 5}));
  s.fill_(9);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 9, 9, 3, 9, 9}));
  EXPECT_EQ(t.reshape({-1}).shape(), (Shape{6}));
  EXPECT_THROW(t.reshape({4, -1}), std::invalid_argument);
  EXPECT_EQ(t.unsqueeze(0).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(t.unsqueeze(0).squeeze(0).shape(), (Shape{2, 3}));
}

TEST(Tensor, ChannelsLastLayout) {
  Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7}, {1, 2, 2, 2});  // N C H W
  Tensor cl = t.contiguous(MemoryFormat::channels_last);
  EXPECT_TRUE(cl.is_contiguous(MemoryFormat::channels_last));
  EXPECT_FALSE(cl.is_contiguous());
  EXPECT_EQ(cl.suggest_memory_format(), MemoryFormat::channels_last);
  const float* raw = cl.data<float>();  // NHWC in memory: c varies fastest
  EXPECT_EQ((std::vector<float>(raw, raw + 8)), (std::vector<float>{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_EQ(cl.contiguous().to_vector<float>(), t.to_vector<float>());
}

// A one-channel batch has the same memory order in both formats. Asked for channels-last it must say
// so (its size-1 channel stride marks it, without a copy), or every convolution after a grey-scale
// input would run in NCHW.
TEST(Tensor, OneChannelBatchKeepsTheFormatItWasAskedFor) {
  Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7}, {2, 1, 2, 2});
  EXPECT_EQ(t.suggest_memory_format(), MemoryFormat::contiguous);
  Tensor cl = t.contiguous(MemoryFormat::channels_last);
  EXPECT_TRUE(cl.same_storage(t));
  EXPECT_EQ(cl.suggest_memory_format(), MemoryFormat::channels_last);
  EXPECT_EQ(Tensor::empty({2, 1, 2, 2}, DType::f32, Device::cpu(), MemoryFormat::channels_last)
                .suggest_memory_format(),
            MemoryFormat::channels_last);
  Tensor back = cl.contiguous();
  EXPECT_TRUE(back.same_storage(t));
  EXPECT_EQ(back.suggest_memory_format(), MemoryFormat::contiguous);
  EXPECT_EQ(back.to_vector<float>(), t.to_vector<float>());
  // Shapes whose two stride sets coincide stay contiguous.
  EXPECT_EQ(Tensor::empty({3, 1, 1, 1}, DType::f32, Device::cpu(), MemoryFormat::channels_last)
                .suggest_memory_format(),
            MemoryFormat::contiguous);
}

TEST(Tensor, BinaryBroadcasting) {
  Backend& k = cpu_backend();
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<float>({10, 20, 30}, {3});
  EXPECT_EQ(k.binary(BinaryOp::add, a, b).to_vector<float>(), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  Tensor c = Tensor::from_vector<float>({2, 3}, {2, 1});
  EXPECT_EQ(k.binary(BinaryOp::mul, a, c).to_vector<float>(), (std::vector<float>{2, 4, 6, 12, 15, 18}));
  EXPECT_THROW(k.binary(BinaryOp::add, a, Tensor::zeros({2})), std::invalid_argument);
  EXPECT_EQ(k.sum(a, {0}, false).to_vector<float>(), (std::vector<float>{5, 7, 9}));
  EXPECT_EQ(k.sum(a, {1}, true).shape(), (Shape{2, 1}));
  EXPECT_FALSE(k.all_finite(Tensor::from_vector<float>({1, INFINITY}, {2})));
}

TEST(Tensor, MatmulTransposes) {
  Backend& k = cpu_backend();
  Tensor a = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<double>({1, 0, 0, 1, 1, 1}, {3, 2});
  EXPECT_EQ(k.matmul(a, b, false, false).to_vector<double>(), (std::vector<double>{4, 5, 10, 11}));
  EXPECT_EQ(k.matmul(a, a, false, true).to_vector<double>(), (std::vector<double>{14, 32, 32, 77}));
  EXPECT_THROW(k.matmul(a, a, false, false), std::invalid_argument);
}

}  // namespace
}  // namespace trainer
