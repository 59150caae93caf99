// The Vision Transformer and its ops on the GPU: the small ViT's logits and every gradient against the
// CPU in f32, F::bmm under autocast (half product, f32 master gradients), the ViT under bf16 and fp16
// autocast against its f32 run, and ViT-S/16's bf16 step with cuDNN's fused attention and without it,
// each against the f32 step. The kernels alone are in the op table (bmm and attention cases) and
// tests/gpu/fused_attention_test.cpp.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "nn/amp/autocast.h"
#include "nn/cuda/fused_attention.h"
#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/runtime.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

// A ViT whose zero-initialised head and class token are given values, so every gradient is
// non-trivial.
std::shared_ptr<Module> vit_with_live_head(const ModelOptions& o) {
  auto m = create_model(o);
  Generator gen(4);
  for (auto& nt : m->state_dict())
    if (nt.name == "heads.head.weight" || nt.name == "class_token") uniform_(*nt.tensor, -0.2, 0.2, gen);
  return m;
}

std::shared_ptr<Module> small_vit() {
  ModelOptions o;
  o.name = "vit";
  o.in_channels = 3;
  o.image_size = 16;
  o.num_classes = 10;
  o.patch_size = 4, o.depth = 2, o.width = 64, o.heads = 4, o.mlp_dim = 128, o.seed = 3;
  return vit_with_live_head(o);
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

// Each gradient's error relative to its norm floored at 1% of the largest gradient's (autocast_test.cpp's
// rule), the largest over the parameters.
double worst_gradient_error(const Outcome& got, const Outcome& ref) {
  double largest = 0.0, worst = 0.0;
  for (const Tensor& g : ref.grads) largest = std::max(largest, norm(g));
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    const double n = norm(ref.grads[i]);
    worst = std::max(worst, relative_error(got.grads[i], ref.grads[i]) * n / std::max(n, 0.01 * largest));
  }
  return worst;
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
    // fp16 gradients without loss scaling lose the smallest ones to underflow: hence the floor.
    EXPECT_LT(worst_gradient_error(got, ref), 0.1) << dtype_name(half);
  }
}

// ViT-S/16 at 224x224 (197 tokens, 6 heads of 64): its bf16 step with the fused attention and with
// the composed one, each against the f32 step (composed: f32 never fuses). The fused step must be as
// close as the composed one, within rounding.
TEST(ViTGpu, FusedAttentionStepFollowsF32AsTheComposedStepDoes) {
  REQUIRE_GPU();
  ModelOptions o;
  o.name = "vit_s_16", o.image_size = 224, o.num_classes = 10, o.seed = 3;
  auto m = vit_with_live_head(o);
  m->to(gpu());
  Generator gen(8);
  const Tensor x = on_gpu(random({4, 3, 224, 224}, gen));
  const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 5, 2, 9}, {4}).to(gpu());
  const Outcome ref = forward_backward(*m, x, y, std::nullopt);
  const int64_t forwards = cuda::fused_attention_forward_calls(),
                backwards = cuda::fused_attention_backward_calls();
  const Outcome fused = forward_backward(*m, x, y, DType::bf16);
  EXPECT_EQ(cuda::fused_attention_forward_calls() - forwards, 12) << "one fused forward per encoder layer";
  EXPECT_EQ(cuda::fused_attention_backward_calls() - backwards, 12) << "one fused backward per encoder layer";
  Outcome composed;
  {
    runtime::ScopedBackendOptions off([](runtime::BackendOptions& b) { b.fused_attention = false; });
    composed = forward_backward(*m, x, y, DType::bf16);
  }
  EXPECT_EQ(cuda::fused_attention_forward_calls() - forwards, 12)
      << "the switch must force the composed path";
  const double fused_logits = relative_error(fused.logits, ref.logits),
               composed_logits = relative_error(composed.logits, ref.logits);
  const double fused_grads = worst_gradient_error(fused, ref),
               composed_grads = worst_gradient_error(composed, ref);
  EXPECT_LT(fused_logits, 5e-2);
  EXPECT_LT(fused_grads, 0.1);
  // Both round the same products to bf16 at different points: comparable errors, not equal ones.
  EXPECT_LT(fused_logits, 2 * composed_logits + 1e-3) << "composed " << composed_logits;
  EXPECT_LT(fused_grads, 2 * composed_grads + 1e-2) << "composed " << composed_grads;
}

}  // namespace
}  // namespace trainer
