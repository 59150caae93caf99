// Mixed precision on the GPU: autocast runs convolutions and matmuls in half with fp32 master weights
// and gradients, keeps batch-norm statistics and the loss in fp32, and trains like fp32 (bf16, and fp16
// with the loss scaler). The fp32 run on the same device is the reference.
#include "nn/amp/autocast.h"

#include <cmath>
#include <optional>

#include "nn/amp/loss_scaler.h"
#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/optim/sgd.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

std::shared_ptr<Module> make_model(const std::string& name, int channels) {
  return gpu_model(name, channels, 16, "cifar", 7);
}

struct Batch {
  Tensor x, y;
};

Batch make_batch(int channels, int n = 32) {
  Generator gen(3);
  Batch b;
  b.x = on_gpu(random({n, channels, 16, 16}, gen), MemoryFormat::channels_last);
  std::vector<int64_t> t(n);
  for (int64_t& v : t) v = static_cast<int64_t>(gen.below(10));
  b.y = Tensor::from_vector(t, {n}).to(gpu());
  return b;
}

TEST(Autocast, HalfForwardWithFp32MasterGradients) {
  REQUIRE_GPU();
  const Batch b = make_batch(1);
  auto grads_of = [&](std::optional<DType> half, DType* logits_dtype, double* loss) {
    auto model = make_model("cnn", 1);
    Variable l;
    {
      AutocastScope autocast(half);
      Variable logits = (*model)(Variable(b.x));
      *logits_dtype = logits.dtype();
      l = F::cross_entropy(logits, b.y);
    }
    EXPECT_EQ(l.dtype(), DType::f32);  // the loss is on autocast's fp32 list
    *loss = l.item();
    // fp16 gradients underflow without loss scaling (what the LossScaler is for): scale by 1024.
    LossScalerOptions so;
    so.enabled = half == DType::f16;
    so.init_scale = 1024;
    LossScaler scaler(so);
    scaler.scale_loss(l).backward();
    const std::vector<Variable> params = model->parameters();
    EXPECT_TRUE(scaler.unscale_and_check(params));
    std::vector<Tensor> grads;
    for (const Variable& p : params) {
      EXPECT_EQ(p.dtype(), DType::f32);
      EXPECT_EQ(p.grad().dtype(), DType::f32);  // master weights receive fp32 gradients
      grads.push_back(p.grad());
    }
    return grads;
  };
  DType dt;
  double ref_loss;
  const std::vector<Tensor> ref = grads_of(std::nullopt, &dt, &ref_loss);
  EXPECT_EQ(dt, DType::f32);
  // Errors relative to each gradient's norm, floored at 1% of the largest: the bias of a convolution
  // followed by batch norm has a gradient of (rounding) noise around 0.
  double largest = 0;
  for (const Tensor& g : ref) largest = std::max(largest, norm(g));
  for (DType half : {DType::bf16, DType::f16}) {
    double loss;
    const std::vector<Tensor> got = grads_of(half, &dt, &loss);
    EXPECT_EQ(dt, half);
    EXPECT_NEAR(loss, ref_loss, 2e-2 * std::fabs(ref_loss));
    for (size_t i = 0; i < ref.size(); ++i) {
      const double n = norm(ref[i]);
      const double err = relative_error(got[i], ref[i]) * n / std::max(n, 0.01 * largest);
      // Not rounding alone: a value rounded to half can flip a ReLU or change which element wins a
      // max-pool window, routing that gradient elsewhere, in both half types alike. The H200 showed
      // 5-7% for both; a broken cast or a wrong-layout weight gives O(1).
      EXPECT_LT(err, 0.15) << dtype_name(half) << " parameter " << i;
    }
  }
}

TEST(Autocast, BatchNormStatisticsStayFp32) {
  REQUIRE_GPU();
  Generator gen(11);
  const Tensor x = random({8, 4, 6, 6}, gen, DType::f32, 100.0, 101.0);  // large mean, small spread
  for (DType half : {DType::bf16, DType::f16}) {
    const auto [mean, var] = dev().bn_mean_var(on_gpu(x.to(half), MemoryFormat::channels_last));
    EXPECT_EQ(mean.dtype(), DType::f32);
    EXPECT_EQ(var.dtype(), DType::f32);
    const auto [mean_ref, var_ref] = cpu().bn_mean_var(x.to(half).to(DType::f32));
    expect_close(mean_ref, mean, 1e-6, 1e-4, "mean of half input");
    expect_close(var_ref, var, 1e-4, 1e-5, "variance of half input");  // in bf16 var would be off by %
  }
}

// Losses of `steps` SGD steps on one batch (the model memorises it), in the given precision.
std::vector<double> train_steps(const std::string& name, std::optional<DType> half, int steps,
                                LossScaler* scaler) {
  const int channels = name == "cnn" ? 1 : 3;
  auto model = make_model(name, channels);
  SgdOptions so;
  so.lr = 0.05, so.momentum = 0.9;
  Sgd opt(model->named_parameters(), so);
  const Batch b = make_batch(channels);
  const std::vector<Variable> params = model->parameters();
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    Variable loss;
    {
      AutocastScope autocast(half);
      loss = F::cross_entropy((*model)(Variable(b.x)), b.y);
    }
    losses.push_back(loss.item());
    scaler->scale_loss(loss).backward();
    if (scaler->on_device()) {  // the decision stays on the device: the optimizer skips on the flag
      opt.skip_if(scaler->found_inf_flag());
      scaler->unscale_on_device(params);
      opt.step();
      scaler->update_on_device();
    } else {
      const bool finite = !scaler->enabled() || scaler->unscale_and_check(params);
      if (finite) opt.step();
      scaler->update(!finite);
    }
    opt.zero_grad();
  }
  return losses;
}

TEST(Autocast, Resnet18TrainsInBf16AndFp16LikeFp32) {
  REQUIRE_GPU();
  LossScalerOptions off;
  off.enabled = false;
  LossScaler none(off);
  const std::vector<double> ref = train_steps("resnet18", std::nullopt, 15, &none);
  ASSERT_LT(ref.back(), 0.5 * ref.front());  // the reference run learns
  LossScaler bf16_scaler(off);
  const std::vector<double> bf16 = train_steps("resnet18", DType::bf16, 15, &bf16_scaler);
  LossScaler fp16_scaler;  // GradScaler defaults: 65536, growth every 2000 steps
  const std::vector<double> fp16 = train_steps("resnet18", DType::f16, 15, &fp16_scaler);
  for (size_t s = 0; s < ref.size(); ++s) {
    const double tol = 0.05 + 0.1 * ref[s];
    EXPECT_NEAR(bf16[s], ref[s], tol) << "bf16 step " << s;
    EXPECT_NEAR(fp16[s], ref[s], tol) << "fp16 step " << s;
  }
  EXPECT_EQ(fp16_scaler.skipped_steps(), 0);
  // The scaler kept on the device gives the same run, bit for bit.
  LossScaler device_scaler;
  device_scaler.keep_on_device(Device::cuda(0));
  EXPECT_EQ(train_steps("resnet18", DType::f16, 15, &device_scaler), fp16);
  EXPECT_EQ(device_scaler.skipped_steps(), 0);
}

// One fp16 step of the cnn whose scaled gradients overflow (fp16's largest value is 65504), with the
// loss scaler deciding on the host (the caller skips step()) or kept on the device (the SGD kernel
// skips on the flag, nothing is read on the host until the test asks): either way the weights and the
// momentum buffers are untouched, the scale halves and one step counts as skipped.
void expect_overflow_skips_the_step(bool on_device) {
  LossScalerOptions o;
  o.init_scale = 0x1p100;  // exact in f32, the device's scale
  LossScaler scaler(o);
  if (on_device) scaler.keep_on_device(Device::cuda(0));
  auto model = make_model("cnn", 1);
  std::vector<Tensor> before;
  for (const Variable& p : model->parameters()) before.push_back(p.data().clone());
  SgdOptions so;
  so.lr = 0.1, so.momentum = 0.9;
  Sgd opt(model->named_parameters(), so);
  if (on_device) opt.skip_if(scaler.found_inf_flag());
  const Batch b = make_batch(1);
  Variable loss;
  {
    AutocastScope autocast(DType::f16);
    loss = F::cross_entropy((*model)(Variable(b.x)), b.y);
  }
  scaler.scale_loss(loss).backward();
  const std::vector<Variable> params = model->parameters();
  if (on_device) {
    scaler.unscale_on_device(params);
    opt.step();
    scaler.update_on_device();
  } else {
    EXPECT_FALSE(scaler.unscale_and_check(params));
    scaler.update(true);
  }
  EXPECT_EQ(scaler.scale(), 0x1p99);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(relative_error(params[i].data(), before[i]), 0.0) << "parameter " << i;
  for (const auto& [name, slot] : opt.state_tensors()) {
    if (name.rfind("momentum_buffer.", 0) != 0) continue;  // the device path's step counts do advance
    for (double v : slot.to(Device::cpu()).to_vector<double>()) EXPECT_EQ(v, 0.0) << name;
  }
}

TEST(Autocast, Fp16OverflowSkipsTheStepAndHalvesTheScale) {
  REQUIRE_GPU();
  expect_overflow_skips_the_step(false);
}

TEST(Autocast, Fp16OverflowSkipsOnTheDeviceAndHalvesTheScale) {
  REQUIRE_GPU();
  expect_overflow_skips_the_step(true);
}

}  // namespace
}  // namespace trainer
