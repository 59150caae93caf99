// timm's Lamb and Lars (three steps, two settings each) and ModelEmaV3 (seven updates of a
// BatchNorm2d's state, with and without the decay's warm-up) against float64 PyTorch transcriptions of
// timm's algorithms stored in tests/nn/golden/ by scripts/make_optim_golden.py: every value within 1e-6.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "nn/modules/batch_norm.h"
#include "nn/optim/ema.h"
#include "nn/optim/lamb.h"
#include "nn/optim/lars.h"
#include "nn/safetensors.h"

namespace trainer {
namespace {

constexpr double kTolerance = 1e-6;
const char* const kNames[] = {"w", "b", "k"};
constexpr int kSteps = 3;

std::string golden_path() {
  const std::string name = "tests/nn/golden/optim_lamb_lars_ema.safetensors";
  const std::string in_source = std::string(TRAINER_SOURCE_DIR) + "/" + name;
  return ::access(in_source.c_str(), R_OK) == 0 ? in_source : name;
}

const std::map<std::string, Tensor>& golden() {
  static const std::map<std::string, Tensor> g = load_safetensors(golden_path());
  return g;
}

const Tensor& at(const std::string& name) {
  auto it = golden().find(name);
  if (it == golden().end()) throw std::runtime_error("golden file lacks " + name);
  return it->second;
}

void expect_close(const Tensor& ours, const Tensor& want, const std::string& what) {
  const Tensor a = ours.to(DType::f64).contiguous(), b = want.to(DType::f64).contiguous();
  ASSERT_EQ(a.shape(), b.shape()) << what;
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::fabs(a.data<double>()[i] - b.data<double>()[i]));
  EXPECT_LE(worst, kTolerance) << what;
}

std::vector<NamedParameter> golden_params() {
  std::vector<NamedParameter> params;
  for (const char* k : kNames)
    params.push_back({k, Variable(at(std::string("input.param.") + k).clone(), true)});
  return params;
}

// Runs kSteps steps with the golden gradients; no_decay_bn_bias puts the 1-D "b" in the weight-decay-0
// group, as the script does.
void run_steps(Optimizer& opt, std::vector<NamedParameter>& params) {
  for (int s = 0; s < kSteps; ++s) {
    for (NamedParameter& p : params)
      p.param.grad() = at("input.grad" + std::to_string(s) + "." + p.name).clone();
    opt.step();
    opt.zero_grad();
  }
}

void expect_state(const Optimizer& opt, const std::vector<NamedParameter>& params, const std::string& c) {
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : opt.state_tensors()) state[name] = t;
  for (const NamedParameter& p : params) {
    expect_close(p.param.data(), at(c + ".param." + p.name), c + " param " + p.name);
    for (const std::string& slot : opt.state_slots())
      expect_close(state.at(slot + "." + p.name), at(c + "." + slot + "." + p.name),
                   c + " " + slot + " " + p.name);
  }
}

TEST(OptimGolden, LambMatchesTimmWithGlobalClipping) {
  std::vector<NamedParameter> params = golden_params();
  LambOptions o;
  o.lr = 0.01, o.weight_decay = 0.05, o.max_grad_norm = 1.0, o.no_decay_bn_bias = true;
  Lamb lamb(params, o);
  run_steps(lamb, params);
  expect_state(lamb, params, "lamb");
}

TEST(OptimGolden, LambcMatchesTimmWithTrustClipAndNoClipping) {
  std::vector<NamedParameter> params = golden_params();
  LambOptions o;
  o.lr = 0.02, o.weight_decay = 0.01, o.max_grad_norm = 0.0, o.trust_clip = true, o.no_decay_bn_bias = true;
  Lamb lamb(params, o);
  run_steps(lamb, params);
  expect_state(lamb, params, "lambc");
}

TEST(OptimGolden, LarsMatchesTimmWithDampening) {
  std::vector<NamedParameter> params = golden_params();
  LarsOptions o;
  o.lr = 0.5, o.weight_decay = 1e-4, o.momentum = 0.9, o.dampening = 0.1, o.trust_coeff = 1e-3;
  o.no_decay_bn_bias = true;
  Lars lars(params, o);
  run_steps(lars, params);
  expect_state(lars, params, "lars");
}

TEST(OptimGolden, LarcMatchesTimmWithNesterovAndTrustClip) {
  std::vector<NamedParameter> params = golden_params();
  LarsOptions o;
  o.lr = 0.002, o.weight_decay = 5e-4, o.momentum = 0.9, o.nesterov = true, o.trust_coeff = 0.02;
  o.trust_clip = true, o.no_decay_bn_bias = true;
  Lars lars(params, o);
  run_steps(lars, params);
  expect_state(lars, params, "larc");
}

// The model's state at update i, from the golden inputs.
void load_model_state(BatchNorm2d& bn, int i) {
  for (NamedTensor& entry : bn.state_dict())
    entry.tensor->copy_(at("ema_input" + std::to_string(i) + "." + entry.name));
}

void check_ema(const std::string& name, const EmaOptions& options) {
  BatchNorm2d bn(3);
  bn.to(DType::f64);
  load_model_state(bn, 0);
  ModelEma ema(bn, options);
  for (int i = 0; i < 7; ++i) {
    load_model_state(bn, i);
    ema.after_optimizer_step(false, nullptr);
  }
  EXPECT_EQ(ema.updates(), 7);
  for (const auto& [entry, value] : ema.state_tensors())
    expect_close(value, at(name + "." + entry), name + " " + entry);
}

TEST(OptimGolden, EmaMatchesModelEmaV3WithWarmup) {
  EmaOptions o;
  o.decay = 0.999, o.warmup = true;
  check_ema("ema_warmup", o);
}

TEST(OptimGolden, EmaMatchesModelEmaV3WithoutWarmup) {
  EmaOptions o;
  o.decay = 0.8;
  check_ema("ema_plain", o);
}

}  // namespace
}  // namespace trainer
