// copy and fill: host <-> device round trips for every dtype, strided and channels-last layouts on
// either side, dtype conversions on the device (bit-identical to the CPU's), fill.
#include <cstring>

#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

const DType kAllDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::u8};

// Values every dtype holds exactly (integers in [0, 100)) or, for floats, random reals (non-negative
// when they will be converted to u8: C++ leaves negative float -> unsigned conversions undefined).
Tensor sample(const Shape& shape, DType dtype, Generator& gen, bool non_negative = false) {
  if (is_floating(dtype)) return random(shape, gen, dtype, non_negative ? 0.0 : -50.0, 50.0);
  Tensor t = Tensor::empty(shape, DType::f64);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (double& x : v) x = static_cast<double>(gen.below(100));
  return Tensor::from_vector(v, shape).to(dtype);
}

// Byte-exact comparison of two host tensors of the same dtype, in logical order.
void expect_bitwise(const Tensor& expected, const Tensor& actual, const std::string& what) {
  ASSERT_EQ(expected.dtype(), actual.dtype()) << what;
  const Tensor e = expected.to(Device::cpu()).contiguous(), a = actual.to(Device::cpu()).contiguous();
  ASSERT_EQ(e.nbytes(), a.nbytes()) << what;
  EXPECT_EQ(std::memcmp(e.raw_data(), a.raw_data(), e.nbytes()), 0) << what;
}

TEST(CudaCopy, RoundTripEveryDtype) {
  REQUIRE_GPU();
  Generator gen(1);
  for (DType dtype : kAllDtypes) {
    const Tensor host = sample({3, 5, 7}, dtype, gen);
    const Tensor dev = host.to(gpu());
    EXPECT_TRUE(dev.device().is_cuda());
    expect_bitwise(host, dev.to(Device::cpu()), std::string(dtype_name(dtype)));
    // Device -> device copy and clone.
    expect_bitwise(host, dev.clone(), std::string(dtype_name(dtype)) + " clone");
  }
}

TEST(CudaCopy, ConversionsMatchTheCpuBitForBit) {
  REQUIRE_GPU();
  Generator gen(2);
  for (DType from : kAllDtypes)
    for (DType to : kAllDtypes) {
      const Tensor host = sample({4, 33}, from, gen, to == DType::u8);
      const Tensor expected = host.to(to);          // CPU conversion
      const Tensor actual = host.to(gpu()).to(to);  // device conversion
      expect_bitwise(expected, actual, std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
      // Host -> device with conversion in one copy_, and device -> host with conversion.
      Tensor dst = Tensor::empty({4, 33}, to, gpu());
      dst.copy_(host);
      expect_bitwise(expected, dst,
                     "h2d " + std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
      Tensor back = Tensor::empty({4, 33}, to);
      back.copy_(host.to(gpu()));
      expect_bitwise(expected, back,
                     "d2h " + std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
    }
}

TEST(CudaCopy, StridedAndChannelsLastLayouts) {
  REQUIRE_GPU();
  Generator gen(3);
  for (DType dtype : {DType::f32, DType::f16, DType::i64}) {
    const Tensor host = sample({2, 3, 4, 5}, dtype, gen);
    const std::string name(dtype_name(dtype));
    // Device permute / slice views made contiguous on the device.
    const Tensor dev = host.to(gpu());
    expect_bitwise(host.permute({0, 2, 3, 1}).contiguous(), dev.permute({0, 2, 3, 1}).contiguous(),
                   name + " permute");
    expect_bitwise(host.slice(3, 1, 5, 2).contiguous(), dev.slice(3, 1, 5, 2).contiguous(), name + " slice");
    // Channels-last on the device, then back in either layout.
    const Tensor cl = dev.contiguous(MemoryFormat::channels_last);
    EXPECT_TRUE(cl.is_contiguous(MemoryFormat::channels_last));
    expect_bitwise(host, cl.to(Device::cpu()), name + " channels_last d2h");
    expect_bitwise(host, cl.contiguous(), name + " channels_last -> contiguous");
    // Non-contiguous host source into a channels-last device tensor, and device into a strided host view.
    Tensor dst = Tensor::empty(host.shape(), dtype, gpu(), MemoryFormat::channels_last);
    dst.copy_(host.permute({0, 1, 3, 2}).contiguous().permute({0, 1, 3, 2}));
    expect_bitwise(host, dst, name + " strided h2d");
    Tensor big = Tensor::zeros({2, 3, 4, 10}, dtype);
    Tensor view = big.slice(3, 0, 10, 2);
    view.copy_(cl);
    expect_bitwise(host, view, name + " d2h into a strided view");
    // Device strided -> device strided with conversion.
    Tensor conv = Tensor::empty({2, 3, 5, 4}, DType::f64, gpu()).permute({0, 1, 3, 2});
    conv.copy_(cl);
    expect_bitwise(host.to(DType::f64), conv, name + " strided convert");
  }
}

TEST(CudaCopy, ManyDimsAndBroadcastViews) {
  REQUIRE_GPU();
  Generator gen(4);
  const Tensor host = sample({2, 1, 3, 2, 1, 2, 3, 2, 2}, DType::f32, gen);  // 9 dims, size-1 dims drop out
  expect_bitwise(host.permute({8, 7, 6, 5, 4, 3, 2, 1, 0}).contiguous(),
                 host.to(gpu()).permute({8, 7, 6, 5, 4, 3, 2, 1, 0}).contiguous(), "9-d permute");
}

TEST(CudaFill, EveryDtypeAndStridedViews) {
  REQUIRE_GPU();
  for (DType dtype : kAllDtypes)
    for (double value : {0.0, 1.0, -2.5, 3.25e3}) {
      if (!is_floating(dtype) && value < 0) continue;
      const Tensor expected = Tensor::full({5, 7}, value, dtype);
      expect_bitwise(expected, Tensor::full({5, 7}, value, dtype, gpu()), std::string(dtype_name(dtype)));
    }
  Tensor t = Tensor::zeros({4, 6}, DType::f32, gpu());
  Tensor view = t.slice(1, 1, 6, 2);
  view.fill_(7.0);
  Tensor expected = Tensor::zeros({4, 6});
  Tensor ev = expected.slice(1, 1, 6, 2);
  ev.fill_(7.0);
  expect_equal(expected, t, "strided fill");
  Tensor scalar = Tensor::scalar(4.0, DType::f64, gpu());
  EXPECT_EQ(scalar.item(), 4.0);
}

}  // namespace
}  // namespace trainer
