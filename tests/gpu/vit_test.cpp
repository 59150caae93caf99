// The Vision Transformer and its ops on the GPU: the small ViT's logits and every gradient against the
// CPU in f32, F::bmm under autocast (half product, f32 master gradients), and the ViT under bf16 and
// fp16 autocast against its f32 run. The kernels alone are in the op table (bmm cases).
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "nn/amp/autocast.h"
#include "nn/functional.h"
#include "nn/models/registry.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

// A small ViT whose zero-initialised head and class token are given values, so every gradient is
// non-trivial.
std::shared_ptr<Module> small_vit() {
  ModelOptions o;
  o.name = "vit";
  o.in_channels = 3;
  o.image_size = 16;
  o.num_classes = 10;
  o.patch_size = 4, o.depth = 2, o.width = 64, o.heads = 4, o.mlp_dim = 128, o.seed = 3;
  auto m = create_model(o);
  Generator gen(4);
  for (auto& nt : m->state_dict())
    if (nt.name == "heads.head.weight" || nt.name == "class_token") uniform_(*nt.tensor, -0.2, 0.2, gen);
  return m;
}

struct Outcome {
  Tensor logits;
  std::vector<Tensor> grads;
};

Outcome forward_backward(Module& m, const Tensor& x, const Tensor& y, std::optional<DType> autocast) {
  m.zero_grad();
  Variable loss;
  Outcome r;
  {
    AutocastScope scope(autocast);
    const Variable logits = m.forward(Variable(x));
    r.logits = logits.data().to(Device::cpu()).to(DType::f32);
    loss = F::cross_entropy(logits, y);
  }
  loss.backward();
  for (const Variable& p : m.parameters()) r.grads.push_back(p.grad().to(Device::cpu()));
  return r;
}

TEST(ViTGpu, SmallViTMatchesTheCpuInF32) {
  REQUIRE_GPU();
  Generator gen(5);
  const Tensor x = random({6, 3, 16, 16}, gen);
  const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 3, 9, 1, 1, 7}, {6});
  auto on_cpu = small_vit(), on_dev = small_vit();
  on_dev->to(gpu());
  const Outcome ref = forward_backward(*on_cpu, x, y, std::nullopt),
                got = forward_backward(*on_dev, on_gpu(x), y.to(gpu()), std::nullopt);
  EXPECT_LT(relative_error(got.logits, ref.logits), 1e-5);
  ASSERT_EQ(got.grads.size(), ref.grads.size());
  for (size_t i = 0; i < ref.grads.size(); ++i)
    EXPECT_LT(relative_error(got.grads[i], ref.grads[i]), 1e-4) << i;
}

TEST(ViTGpu, AutocastRunsBmmInHalfWithF32Gradients) {
  REQUIRE_GPU();
  Generator gen(6);
  Variable a(on_gpu(random({4, 17, 32}, gen)), true), b(on_gpu(random({4, 32, 17}, gen)), true);
  F::sum(F::bmm(a, b)).backward();
  const Tensor ga = a.grad().to(Device::cpu()), gb = b.grad().to(Device::cpu());
  for (DType half : {DType::bf16, DType::f16}) {
    a.zero_grad(), b.zero_grad();
    Variable y;
    {
      AutocastScope scope(half);
      y = F::bmm(a, b);
    }
    EXPECT_EQ(y.dtype(), half);
    F::sum(y).backward();
    EXPECT_EQ(a.grad().dtype(), DType::f32);
    EXPECT_LT(relative_error(a.grad(), ga), 1e-2) << dtype_name(half);
    EXPECT_LT(relative_error(b.grad(), gb), 1e-2) << dtype_name(half);
  }
}

TEST(ViTGpu, SmallViTUnderAutocastFollowsF32) {
  REQUIRE_GPU();
  Generator gen(7);
  const Tensor x = on_gpu(random({8, 3, 16, 16}, gen));
  const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8}).to(gpu());
  auto m = small_vit();
  m->to(gpu());
  const Outcome ref = forward_backward(*m, x, y, std::nullopt);
  for (DType half : {DType::bf16, DType::f16}) {
    const Outcome got = forward_backward(*m, x, y, half);
    // Rounding only (no ReLU or max-pool to flip): bf16 keeps 8 bits, so a few percent at most.
    EXPECT_LT(relative_error(got.logits, ref.logits), 5e-2) << dtype_name(half);
    // Errors relative to each gradient's norm floored at 1% of the largest (autocast_test.cpp's rule):
    // fp16 gradients without loss scaling lose the smallest ones to underflow.
    double largest = 0.0;
    for (const Tensor& g : ref.grads) largest = std::max(largest, norm(g));
    for (size_t i = 0; i < ref.grads.size(); ++i) {
      const double n = norm(ref.grads[i]);
      const double err = relative_error(got.grads[i], ref.grads[i]) * n / std::max(n, 0.01 * largest);
      EXPECT_LT(err, 0.1) << dtype_name(half) << " parameter " << i;
    }
  }
}

}  // namespace
}  // namespace trainer
