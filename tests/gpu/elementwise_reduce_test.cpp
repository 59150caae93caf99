// Elementwise ops and reductions: the CUDA backend against the CPU backend on random inputs, in f32,
// f64 and (against an f32 reference on the rounded inputs) f16/bf16, with strided, broadcast and
// channels-last operands.
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

const BinaryOp kBinaryOps[] = {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div};
const UnaryOp kUnaryOps[] = {UnaryOp::neg, UnaryOp::relu, UnaryOp::sigmoid, UnaryOp::exp,
                             UnaryOp::log, UnaryOp::sqrt, UnaryOp::square,  UnaryOp::abs};

struct Precision {
  DType dtype;
  double rtol, atol;
};
const Precision kPrecisions[] = {{DType::f32, 1e-6, 1e-6},
                                 {DType::f64, 1e-13, 1e-13},
                                 {DType::f16, 2e-3, 1e-3},
                                 {DType::bf16, 1e-2, 1e-2}};

// The CPU reference dtype and input for a GPU input of `dtype`.
Tensor reference_input(const Tensor& t) {
  return (t.dtype() == DType::f16 || t.dtype() == DType::bf16) ? as_f32(t) : t.to(Device::cpu());
}

bool positive_only(UnaryOp op) { return op == UnaryOp::log || op == UnaryOp::sqrt; }

TEST(CudaElementwise, BinaryWithBroadcastAndLayouts) {
  REQUIRE_GPU();
  Generator gen(10);
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{4, 5}, {4, 5}}, {{3, 4, 5}, {5}}, {{3, 1, 5}, {4, 1}}, {{2, 3, 4, 5}, {3, 1, 1}}, {{7}, {}}};
  for (const Precision& pr : kPrecisions)
    for (BinaryOp op : kBinaryOps)
      for (const auto& [sa, sb] : shapes) {
        const Tensor a = random(sa, gen, pr.dtype, 0.5, 2.0), b = random(sb, gen, pr.dtype, 0.5, 2.0);
        const Tensor expected = cpu().binary(op, reference_input(a), reference_input(b));
        const Tensor actual = dev().binary(op, a.to(gpu()), b.to(gpu()));
        EXPECT_EQ(actual.dtype(), pr.dtype);
        expect_close(expected, actual, pr.rtol, pr.atol, "binary " + shape_str(sa) + " " + shape_str(sb));
      }
  // Strided and channels-last operands.
  for (const Precision& pr : kPrecisions) {
    const Tensor a = random({2, 3, 4, 5}, gen, pr.dtype), b = random({2, 3, 5, 4}, gen, pr.dtype);
    const Tensor bt = b.permute({0, 1, 3, 2});
    const Tensor expected = cpu().binary(BinaryOp::mul, reference_input(a), reference_input(bt));
    expect_close(expected, dev().binary(BinaryOp::mul, a.to(gpu()), b.to(gpu()).permute({0, 1, 3, 2})),
                 pr.rtol, pr.atol, "binary strided");
    const Tensor acl = on_gpu(a, MemoryFormat::channels_last), bcl = on_gpu(bt, MemoryFormat::channels_last);
    const Tensor out = dev().binary(BinaryOp::mul, acl, bcl);
    EXPECT_TRUE(out.is_contiguous(MemoryFormat::channels_last));
    expect_close(expected, out, pr.rtol, pr.atol, "binary channels_last");
  }
}

TEST(CudaElementwise, ScalarUnaryAndBackward) {
  REQUIRE_GPU();
  Generator gen(11);
  for (const Precision& pr : kPrecisions) {
    const Tensor x = random({6, 7, 3}, gen, pr.dtype, -2.0, 2.0),
                 xp = random({6, 7, 3}, gen, pr.dtype, 0.1, 3.0);
    const Tensor g = random({6, 7, 3}, gen, pr.dtype);
    for (BinaryOp op : kBinaryOps)
      for (bool first : {false, true}) {
        const Tensor in = op == BinaryOp::div && first ? xp : x;
        expect_close(cpu().binary_scalar(op, reference_input(in), 1.75, first),
                     dev().binary_scalar(op, in.to(gpu()), 1.75, first), pr.rtol, pr.atol, "binary_scalar");
      }
    for (UnaryOp op : kUnaryOps) {
      const Tensor in = positive_only(op) ? xp : x;
      const Tensor y_cpu = cpu().unary(op, reference_input(in));
      const Tensor y_gpu = dev().unary(op, in.to(gpu()));
      expect_close(y_cpu, y_gpu, pr.rtol * 4, pr.atol, "unary " + std::to_string(int(op)));
      // The backward gets the GPU's own y (rounded to the dtype), the CPU the same values.
      expect_close(cpu().unary_backward(op, reference_input(g), reference_input(in), reference_input(y_gpu)),
                   dev().unary_backward(op, g.to(gpu()), in.to(gpu()), y_gpu), pr.rtol * 4, pr.atol,
                   "unary_backward " + std::to_string(int(op)));
    }
    // Strided input keeps working; channels-last input keeps its layout.
    const Tensor x4 = random({2, 3, 4, 5}, gen, pr.dtype);
    const Tensor cl = on_gpu(x4, MemoryFormat::channels_last);
    const Tensor r = dev().unary(UnaryOp::relu, cl);
    EXPECT_TRUE(r.is_contiguous(MemoryFormat::channels_last));
    expect_close(cpu().unary(UnaryOp::relu, reference_input(x4)), r, pr.rtol, pr.atol, "relu channels_last");
    expect_close(cpu().unary(UnaryOp::square, reference_input(x4).permute({3, 1, 0, 2})),
                 dev().unary(UnaryOp::square, x4.to(gpu()).permute({3, 1, 0, 2})), pr.rtol, pr.atol,
                 "unary strided");
  }
}

// The residual join's fused gradient equals the GPU's own add then ReLU backward bit for bit (the
// trainer's loss sequence must not change with the fusion), in every dtype and both layouts.
TEST(CudaElementwise, ReluBackwardOfSumEqualsAddThenReluBackward) {
  REQUIRE_GPU();
  Generator gen(14);
  for (const Precision& pr : kPrecisions)
    for (MemoryFormat f : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
      const Tensor a = on_gpu(random({4, 8, 5, 3}, gen, pr.dtype), f),
                   b = on_gpu(random({4, 8, 5, 3}, gen, pr.dtype), f);
      const Tensor y = on_gpu(random({4, 8, 5, 3}, gen, pr.dtype, -1.0, 1.0), f);
      const Tensor fused = dev().relu_backward_of_sum(a, b, y);
      const Tensor separate =
          dev().unary_backward(UnaryOp::relu, dev().binary(BinaryOp::add, a, b), Tensor(), y);
      EXPECT_EQ(fused.to(Device::cpu()).to_vector<double>(), separate.to(Device::cpu()).to_vector<double>());
      expect_close(cpu().relu_backward_of_sum(reference_input(a), reference_input(b), reference_input(y)),
                   fused, pr.rtol, pr.atol, "relu_backward_of_sum");
    }
}

TEST(CudaElementwise, AxpyAndScale) {
  REQUIRE_GPU();
  Generator gen(12);
  for (const Precision& pr : kPrecisions) {
    const Tensor d = random({5, 9}, gen, pr.dtype), s = random({9, 5}, gen, pr.dtype);
    Tensor expected = reference_input(d).clone();
    cpu().axpy(expected, reference_input(s).permute({1, 0}), -0.3);
    Tensor actual = d.to(gpu()).clone();
    dev().axpy(actual, s.to(gpu()).permute({1, 0}), -0.3);
    expect_close(expected, actual, pr.rtol, pr.atol, "axpy");
    cpu().scale(expected, 2.5);
    dev().scale(actual, 2.5);
    expect_close(expected, actual, pr.rtol, pr.atol, "scale");
  }
}

TEST(CudaReduce, SumOverDims) {
  REQUIRE_GPU();
  Generator gen(13);
  const std::vector<std::pair<Shape, std::vector<int>>> cases = {
      {{4, 5, 6}, {}},   {{4, 5, 6}, {0}}, {{4, 5, 6}, {1}}, {{4, 5, 6}, {-1}},          {{4, 5, 6}, {0, 2}},
      {{3, 70000}, {1}}, {{1000000}, {0}}, {{2000, 3}, {0}}, {{8, 16, 9, 9}, {0, 2, 3}}, {{2, 3}, {0, 1}},
      {{}, {}}};
  for (const Precision& pr : {kPrecisions[0], kPrecisions[1]})
    for (const auto& [shape, dims] : cases)
      for (bool keepdim : {false, true}) {
        const Tensor a = random(shape, gen, pr.dtype);
        const Tensor expected = cpu().sum(a, dims, keepdim), actual = dev().sum(a.to(gpu()), dims, keepdim);
        expect_close(expected, actual, pr.dtype == DType::f32 ? 1e-6 : 1e-12, 1e-9,
                     "sum " + shape_str(shape));
      }
  // Strided input and half types.
  const Tensor a = random({6, 5, 4}, gen);
  expect_close(cpu().sum(a.permute({2, 0, 1}), {1}, false),
               dev().sum(a.to(gpu()).permute({2, 0, 1}), {1}, false), 1e-6, 1e-7, "sum strided");
  const Tensor h = random({64, 33}, gen, DType::bf16);
  expect_close(cpu().sum(as_f32(h), {0}, false), dev().sum(h.to(gpu()), {0}, false), 1e-2, 1e-2, "sum bf16");
}

TEST(CudaReduce, BroadcastToAndAllFinite) {
  REQUIRE_GPU();
  Generator gen(14);
  for (const Precision& pr : {kPrecisions[0], kPrecisions[1]}) {
    const Tensor a = random({3, 1, 5}, gen, pr.dtype);
    expect_equal(cpu().broadcast_to(a, {2, 3, 4, 5}), dev().broadcast_to(a.to(gpu()), {2, 3, 4, 5}),
                 "broadcast_to");
    const Tensor b = random({5, 3}, gen, pr.dtype);
    expect_equal(cpu().broadcast_to(b.permute({1, 0}), {4, 3, 5}),
                 dev().broadcast_to(b.to(gpu()).permute({1, 0}), {4, 3, 5}), "broadcast_to strided");
    Tensor x = random({1000, 37}, gen, pr.dtype);
    EXPECT_TRUE(dev().all_finite(x.to(gpu())));
    for (double bad : {std::nan(""), double(INFINITY), -double(INFINITY)}) {
      Tensor y = x.clone();
      Tensor cell = y.slice(0, 517, 518).slice(1, 20, 21);
      cell.fill_(bad);
      EXPECT_EQ(cpu().all_finite(y), dev().all_finite(y.to(gpu())));
      EXPECT_FALSE(dev().all_finite(y.to(gpu())));
      EXPECT_FALSE(dev().all_finite(y.to(gpu()).permute({1, 0})));
      EXPECT_TRUE(dev().all_finite(y.to(gpu()).slice(0, 0, 517)));
    }
  }
  Tensor h = Tensor::full({10}, 70000.0, DType::f32).to(DType::f16);  // overflows to inf in f16
  EXPECT_FALSE(dev().all_finite(h.to(gpu())));
}

}  // namespace
}  // namespace trainer
