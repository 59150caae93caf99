// Optimizers against hand-computed updates and an independent reference loop: SGD (plain, momentum,
// dampening, Nesterov, weight decay), AdamW, parameter groups, skipped parameters, checkpoint state
// and gradient clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "nn/optim/adamw.h"
#include "nn/optim/sgd.h"

namespace trainer {
namespace {

using Values = std::vector<double>;
using GradSequence = std::vector<Values>;

Variable make_param(const Values& values, DType dtype = DType::f64) {
  Tensor t = Tensor::from_vector<double>(values, {static_cast<int64_t>(values.size())}).to(dtype);
  return Variable(t, true);
}

void set_grad(Variable& v, const Values& g) {
  v.grad() = Tensor::from_vector<double>(g, v.shape()).to(v.dtype());
}

Values values(const Variable& v) { return v.data().to_vector<double>(); }

void expect_near(const Values& got, const Values& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << what << " [" << i << "]";
}

// ---- Independent reference implementations, one scalar at a time, in double.

struct RefSgd {
  SgdOptions o;
  std::vector<std::optional<double>> buf;
  void step(Values& p, const Values& g) {
    buf.resize(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = buf[i] ? o.momentum * *buf[i] + (1 - o.dampening) * d : d;
        d = o.nesterov ? d + o.momentum * *buf[i] : *buf[i];
      }
      p[i] -= o.lr * d;
    }
  }
};

struct RefAdamW {
  AdamWOptions o;
  Values m, v;
  int t = 0;
  void step(Values& p, const Values& g) {
    m.resize(p.size(), 0.0);
    v.resize(p.size(), 0.0);
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      const double m_hat = m[i] / (1 - std::pow(o.beta1, t));
      const double v_hat = v[i] / (1 - std::pow(o.beta2, t));
      p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  }
};

const GradSequence kGrads = {{0.5, -1.0, 0.25}, {0.1, 2.0, -0.75}, {-0.3, 0.0, 1.5}};
const Values kStart = {1.0, -0.5, 2.0};

// Runs an optimizer over kGrads and compares every step with the reference.
void run_sgd_against_reference(const SgdOptions& o, DType dtype, double tol) {
  Variable p = make_param(kStart, dtype);
  Sgd opt({{"w", p}}, o);
  RefSgd ref{o, {}};
  Values expected = kStart;
  for (size_t s = 0; s < kGrads.size(); ++s) {
    set_grad(p, kGrads[s]);
    opt.step();
    ref.step(expected, kGrads[s]);
    expect_near(values(p), expected, tol, "sgd step " + std::to_string(s + 1));
  }
}

void run_adamw_against_reference(const AdamWOptions& o, DType dtype, double tol) {
  Variable p = make_param(kStart, dtype);
  AdamW opt({{"w", p}}, o);
  RefAdamW ref{o, {}, {}, 0};
  Values expected = kStart;
  for (size_t s = 0; s < kGrads.size(); ++s) {
    set_grad(p, kGrads[s]);
    opt.step();
    ref.step(expected, kGrads[s]);
    expect_near(values(p), expected, tol, "adamw step " + std::to_string(s + 1));
  }
}

// Steps a single scalar parameter starting at 1 through gradients 1, 2, 3 and returns p after each.
template <class Opt, class Options>
Values scalar_trajectory(const Options& o) {
  Variable p = make_param({1.0});
  Opt opt({{"w", p}}, o);
  Values out;
  for (double g : {1.0, 2.0, 3.0}) {
    set_grad(p, {g});
    opt.step();
    out.push_back(values(p)[0]);
  }
  return out;
}

// ---- SGD: hand-computed trajectories (p0 = 1, grads 1, 2, 3, lr 0.1).

TEST(SgdOptim, PlainMatchesHandComputed) {
  // p -= 0.1 * g: 1 - 0.1 = 0.9, 0.9 - 0.2 = 0.7, 0.7 - 0.3 = 0.4.
  expect_near(scalar_trajectory<Sgd>(SgdOptions{.lr = 0.1}), {0.9, 0.7, 0.4}, 1e-15, "plain");
  run_sgd_against_reference(SgdOptions{.lr = 0.1}, DType::f64, 1e-15);
}

TEST(SgdOptim, MomentumMatchesHandComputed) {
  // buf = 1, 0.9*1 + 2 = 2.9, 0.9*2.9 + 3 = 5.61; p = 0.9, 0.9 - 0.29 = 0.61, 0.61 - 0.561 = 0.049.
  expect_near(scalar_trajectory<Sgd>(SgdOptions{.lr = 0.1, .momentum = 0.9}), {0.9, 0.61, 0.049}, 1e-15,
              "momentum");
  run_sgd_against_reference(SgdOptions{.lr = 0.1, .momentum = 0.9}, DType::f64, 1e-15);
}

TEST(SgdOptim, NesterovMatchesHandComputed) {
  // g + 0.9 * buf: 1.9, 2 + 0.9*2.9 = 4.61, 3 + 0.9*5.61 = 8.049; p = 0.81, 0.349, -0.4559.
  expect_near(scalar_trajectory<Sgd>(SgdOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true}),
              {0.81, 0.349, -0.4559}, 1e-15, "nesterov");
  run_sgd_against_reference(SgdOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true}, DType::f64, 1e-15);
}

TEST(SgdOptim, WeightDecayMatchesHandComputed) {
  // g + 0.1 p: 1.1, 2 + 0.089 = 2.089, 3 + 0.06811 = 3.06811; p = 0.89, 0.6811, 0.374289.
  expect_near(scalar_trajectory<Sgd>(SgdOptions{.lr = 0.1, .weight_decay = 0.1}), {0.89, 0.6811, 0.374289},
              1e-15, "weight decay");
  run_sgd_against_reference(SgdOptions{.lr = 0.1, .weight_decay = 0.1}, DType::f64, 1e-15);
}

TEST(SgdOptim, DampenedMomentumWithWeightDecayMatchesHandComputed) {
  // d = 1.1, buf = 1.1, p = 0.89; d = 2.089, buf = 0.99 + 0.5*2.089 = 2.0345, p = 0.68655;
  // d = 3.068655, buf = 1.83105 + 1.5343275 = 3.3653775, p = 0.35001225.
  const SgdOptions o{.lr = 0.1, .momentum = 0.9, .dampening = 0.5, .weight_decay = 0.1};
  expect_near(scalar_trajectory<Sgd>(o), {0.89, 0.68655, 0.35001225}, 1e-15, "dampening");
  run_sgd_against_reference(o, DType::f64, 1e-15);
}

TEST(SgdOptim, Float32MatchesReference) {
  run_sgd_against_reference(SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true},
                            DType::f32, 1e-6);
}

TEST(SgdOptim, ChannelsLastParameterWithContiguousGradient) {
  // The update is elementwise, so a channels_last weight with a contiguous gradient must end up with
  // the same logical values as a contiguous one.
  Values init(16), grad(16);
  for (int i = 0; i < 16; ++i) init[i] = 0.1 * i - 0.7, grad[i] = std::sin(i);
  Tensor base = Tensor::from_vector<double>(init, {2, 2, 2, 2});
  Variable a(base.clone(), true), b(base.clone(MemoryFormat::channels_last), true);
  const SgdOptions o{.lr = 0.1, .momentum = 0.9};
  Sgd opt_a({{"a", a}}, o), opt_b({{"b", b}}, o);
  for (int s = 0; s < 2; ++s) {
    a.grad() = Tensor::from_vector<double>(grad, {2, 2, 2, 2});
    b.grad() = Tensor::from_vector<double>(grad, {2, 2, 2, 2});
    opt_a.step();
    opt_b.step();
  }
  EXPECT_TRUE(b.data().is_contiguous(MemoryFormat::channels_last));
  EXPECT_EQ(a.data().to_vector<double>(), b.data().to_vector<double>());
}

TEST(SgdOptim, RejectsInvalidOptions) {
  auto make = [](const SgdOptions& o) { Sgd({{"w", make_param({1.0})}}, o); };
  try {
    make(SgdOptions{.lr = 0.1, .momentum = 0.0, .nesterov = true});
    FAIL() << "nesterov without momentum accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("nesterov"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make(SgdOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
               std::invalid_argument);
  EXPECT_THROW(make(SgdOptions{.lr = -0.1}), std::invalid_argument);
  EXPECT_THROW(make(SgdOptions{.lr = 0.1, .momentum = -0.5}), std::invalid_argument);
  EXPECT_THROW(make(SgdOptions{.lr = 0.1, .weight_decay = -1e-4}), std::invalid_argument);
  EXPECT_THROW(Sgd({}, SgdOptions{}), std::invalid_argument);
  Variable p = make_param({1.0});
  EXPECT_THROW(Sgd({{"w", p}, {"w", make_param({2.0})}}, SgdOptions{}), std::invalid_argument);
  EXPECT_THROW(Sgd({{"a", p}, {"b", p}}, SgdOptions{}), std::invalid_argument);
}

// ---- AdamW

TEST(AdamWOptim, MatchesHandComputed) {
  // lr 0.1, wd 0.1, default betas and eps; p0 = 1, grads 1, 2, 3.
  // Step 1: p = 1 * (1 - 0.01) = 0.99; m = 0.1, v = 0.001; m_hat = 1, v_hat = 1;
  //         p = 0.99 - 0.1 * 1 / (1 + 1e-8) = 0.89 + 1e-9 (to first order).
  // Step 2: p = 0.8900000009900 * 0.99; m = 0.09 + 0.2 = 0.29, v = 0.000999 + 0.004 = 0.004999;
  //         m_hat = 0.29 / 0.19, v_hat = 0.004999 / 0.001999.
  const AdamWOptions o{.lr = 0.1, .weight_decay = 0.1};
  const Values got = scalar_trajectory<AdamW>(o);
  EXPECT_NEAR(got[0], 0.89 + 1e-9, 1e-15);
  const double p1 = 0.99 - 0.1 / (1.0 + 1e-8);
  const double p2 = p1 * 0.99 - 0.1 * (0.29 / 0.19) / (std::sqrt(0.004999 / 0.001999) + 1e-8);
  EXPECT_NEAR(got[1], p2, 1e-14);
  // Step 3: m = 0.261 + 0.3 = 0.561, v = 0.004994001 + 0.009 = 0.013994001,
  //         bias corrections 1 - 0.9^3 = 0.271 and 1 - 0.999^3 = 0.002997001.
  const double p3 = p2 * 0.99 - 0.1 * (0.561 / 0.271) / (std::sqrt(0.013994001 / 0.002997001) + 1e-8);
  EXPECT_NEAR(got[2], p3, 1e-14);
}

TEST(AdamWOptim, MatchesReferenceOverThreeSteps) {
  run_adamw_against_reference(AdamWOptions{.lr = 0.1, .weight_decay = 0.1}, DType::f64, 1e-14);
  run_adamw_against_reference(
      AdamWOptions{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-3, .weight_decay = 0.0}, DType::f64,
      1e-14);
  // Golden values from the same formula evaluated in Python.
  Variable p = make_param({1.0, -0.5});
  AdamW opt({{"w", p}}, AdamWOptions{.lr = 0.1, .weight_decay = 0.1});
  const GradSequence grads = {{0.5, -1.0}, {0.1, 2.0}, {-0.3, 0.0}};
  const GradSequence want = {{0.890000002, -0.395000001},
                             {0.8007959063646517, -0.4276603534620748},
                             {0.7717166526798616, -0.45168365845630953}};
  for (size_t s = 0; s < grads.size(); ++s) {
    set_grad(p, grads[s]);
    opt.step();
    expect_near(values(p), want[s], 1e-12, "golden step " + std::to_string(s + 1));
  }
}

TEST(AdamWOptim, Float32MatchesReference) {
  run_adamw_against_reference(AdamWOptions{.lr = 1e-2, .weight_decay = 0.05}, DType::f32, 2e-6);
}

TEST(AdamWOptim, BiasCorrectionCountsEachParametersOwnSteps) {
  // As torch: a parameter first updated at the optimizer's second step gets step-1 bias correction.
  Variable a = make_param({1.0}), b = make_param({1.0});
  AdamW opt({{"a", a}, {"b", b}}, AdamWOptions{.lr = 0.1, .weight_decay = 0.0});
  set_grad(a, {1.0});
  opt.step();
  EXPECT_EQ(values(b)[0], 1.0);
  set_grad(b, {1.0});
  opt.step();
  EXPECT_NEAR(values(b)[0], 1.0 - 0.1 / (1.0 + 1e-8), 1e-15);
  EXPECT_EQ(opt.step_count(), 2);
}

TEST(AdamWOptim, RejectsInvalidOptions) {
  auto make = [](const AdamWOptions& o) { AdamW({{"w", make_param({1.0})}}, o); };
  EXPECT_THROW(make(AdamWOptions{.beta1 = 1.0}), std::invalid_argument);
  EXPECT_THROW(make(AdamWOptions{.beta2 = -0.1}), std::invalid_argument);
  EXPECT_THROW(make(AdamWOptions{.eps = -1.0}), std::invalid_argument);
  EXPECT_THROW(make(AdamWOptions{.lr = -1.0}), std::invalid_argument);
  EXPECT_THROW(make(AdamWOptions{.weight_decay = -0.1}), std::invalid_argument);
}

// ---- Parameter groups, skipped parameters, learning rate

std::vector<NamedParameter> small_model() {
  Variable fc_w(Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2}), true);
  return {{"fc.weight", fc_w},
          {"fc.bias", make_param({1.0, 1.0})},
          {"bn.weight", make_param({2.0, 2.0})},
          {"bn.bias", make_param({3.0, 3.0})}};
}

// timm's exemptions for ViT and ConvNeXt: the class token [1, 1, D] and the layer scale [C, 1, 1] are
// vectors in effect, and the position embedding [1, T, D] is named; a [C, 1, 1, 1]-free matrix decays.
TEST(OptimizerGroups, NoDecayAlsoExemptsClassTokenLayerScaleAndPositionEmbedding) {
  const auto param = [](Shape shape) { return Variable(Tensor::zeros(shape, DType::f64), true); };
  std::vector<NamedParameter> params = {{"class_token", param({1, 1, 4})},
                                        {"encoder.pos_embedding", param({1, 5, 4})},
                                        {"features.1.0.layer_scale", param({4, 1, 1})},
                                        {"encoder.layers.encoder_layer_0.mlp.0.weight", param({8, 4})},
                                        {"conv_proj.weight", param({4, 3, 2, 2})}};
  AdamW opt(params, AdamWOptions{.lr = 0.1, .weight_decay = 0.05, .no_decay_bn_bias = true});
  ASSERT_EQ(opt.param_groups().size(), 2u);
  std::vector<std::string> decayed, exempt;
  for (const NamedParameter& p : opt.param_groups()[0].params) decayed.push_back(p.name);
  for (const NamedParameter& p : opt.param_groups()[1].params) exempt.push_back(p.name);
  EXPECT_EQ(decayed,
            (std::vector<std::string>{"encoder.layers.encoder_layer_0.mlp.0.weight", "conv_proj.weight"}));
  EXPECT_EQ(exempt,
            (std::vector<std::string>{"class_token", "encoder.pos_embedding", "features.1.0.layer_scale"}));
}

TEST(OptimizerGroups, NoDecayBnBiasPutsOneDimensionalParametersInZeroDecayGroup) {
  std::vector<NamedParameter> params = small_model();
  Sgd opt(params, SgdOptions{.lr = 0.1, .weight_decay = 0.5, .no_decay_bn_bias = true});
  ASSERT_EQ(opt.param_groups().size(), 2u);
  const ParamGroup& decay = opt.param_groups()[0];
  const ParamGroup& no_decay = opt.param_groups()[1];
  EXPECT_EQ(decay.weight_decay, 0.5);
  ASSERT_EQ(decay.params.size(), 1u);
  EXPECT_EQ(decay.params[0].name, "fc.weight");
  EXPECT_EQ(no_decay.weight_decay, 0.0);
  ASSERT_EQ(no_decay.params.size(), 3u);
  EXPECT_EQ(no_decay.params[0].name, "fc.bias");
  EXPECT_EQ(no_decay.params[1].name, "bn.weight");
  EXPECT_EQ(no_decay.params[2].name, "bn.bias");

  // With zero gradients only weight decay moves parameters: fc.weight shrinks by 1 - 0.1 * 0.5.
  for (NamedParameter& p : params) p.param.grad() = Tensor::zeros(p.param.shape(), DType::f64);
  opt.step();
  expect_near(values(params[0].param), {0.95, 1.9, 2.85, 3.8}, 1e-15, "fc.weight");
  expect_near(values(params[1].param), {1.0, 1.0}, 0, "fc.bias");
  expect_near(values(params[2].param), {2.0, 2.0}, 0, "bn.weight");
  expect_near(values(params[3].param), {3.0, 3.0}, 0, "bn.bias");

  Sgd plain(small_model(), SgdOptions{.lr = 0.1, .weight_decay = 0.5});
  ASSERT_EQ(plain.param_groups().size(), 1u);
  EXPECT_EQ(plain.param_groups()[0].params.size(), 4u);
  EXPECT_EQ(plain.param_groups()[0].weight_decay, 0.5);

  AdamW adamw(small_model(), AdamWOptions{.weight_decay = 0.05, .no_decay_bn_bias = true});
  ASSERT_EQ(adamw.param_groups().size(), 2u);
  EXPECT_EQ(adamw.param_groups()[1].weight_decay, 0.0);
}

TEST(OptimizerGroups, ParametersWithoutGradientAreUntouched) {
  Variable a = make_param({1.0, 2.0}), b = make_param({3.0, 4.0});
  AdamW adamw({{"a", a}, {"b", b}}, AdamWOptions{.lr = 0.1, .weight_decay = 0.5});
  Sgd sgd({{"a", a}, {"b", b}}, SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.5});
  set_grad(a, {1.0, 1.0});
  adamw.step();
  sgd.step();
  EXPECT_EQ(values(b), (Values{3.0, 4.0}));  // not even weight decay
  EXPECT_NE(values(a), (Values{1.0, 2.0}));
  for (const auto& [name, t] : sgd.state_tensors()) {
    if (name == "step.b") {
      EXPECT_EQ(t.item(), 0.0);
    } else if (name == "step.a") {
      EXPECT_EQ(t.item(), 1.0);
    } else if (name == "momentum_buffer.b") {
      EXPECT_EQ(t.to_vector<double>(), (Values{0.0, 0.0}));
    }
  }
  sgd.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  sgd.step();  // nothing has a gradient: a no-op apart from the count
  EXPECT_EQ(values(b), (Values{3.0, 4.0}));
  EXPECT_EQ(sgd.step_count(), 2);
}

TEST(OptimizerLr, SetLrAppliesToEveryGroup) {
  std::vector<NamedParameter> params = small_model();
  Sgd opt(params, SgdOptions{.lr = 1.0, .no_decay_bn_bias = true});
  opt.set_lr(0.25);
  EXPECT_EQ(opt.lr(), 0.25);
  for (NamedParameter& p : params) p.param.grad() = Tensor::ones(p.param.shape(), DType::f64);
  opt.step();
  expect_near(values(params[0].param), {0.75, 1.75, 2.75, 3.75}, 0, "fc.weight");
  expect_near(values(params[3].param), {2.75, 2.75}, 0, "bn.bias");
  EXPECT_THROW(opt.set_lr(-1.0), std::invalid_argument);
  EXPECT_THROW(opt.set_lr(std::nan("")), std::invalid_argument);
}

// ---- Checkpoint state

// Runs `steps` of a fixed gradient sequence starting at index `from`.
void run_steps(Optimizer& opt, std::vector<NamedParameter>& params, int from, int steps) {
  for (int s = from; s < from + steps; ++s) {
    for (size_t k = 0; k < params.size(); ++k) {
      Variable& v = params[k].param;
      Values g(static_cast<size_t>(v.numel()));
      for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(1.3 * s + 0.7 * k + 0.11 * i);
      v.grad() = Tensor::from_vector<double>(g, v.shape());
    }
    opt.step();
  }
}

std::vector<NamedParameter> clone_params(const std::vector<NamedParameter>& params) {
  std::vector<NamedParameter> out;
  for (const NamedParameter& p : params) out.push_back({p.name, Variable(p.param.data().clone(), true)});
  return out;
}

template <class Opt, class Options>
void check_round_trip(const Options& options, size_t expected_entries) {
  std::vector<NamedParameter> a = small_model();
  Opt opt_a(a, options);
  run_steps(opt_a, a, 0, 2);
  // Snapshot at step 2: parameters and optimizer state.
  std::vector<NamedParameter> b = clone_params(a);
  const std::vector<std::pair<std::string, Tensor>> state = opt_a.state_tensors();
  const int64_t count = opt_a.step_count();
  EXPECT_EQ(state.size(), expected_entries);
  EXPECT_EQ(count, 2);
  run_steps(opt_a, a, 2, 3);  // the snapshot must not follow these

  Opt opt_b(b, options);
  opt_b.load_state(state, count);
  EXPECT_EQ(opt_b.step_count(), 2);
  run_steps(opt_b, b, 2, 3);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(values(a[k].param), values(b[k].param)) << a[k].name;
  const std::vector<std::pair<std::string, Tensor>> state_a = opt_a.state_tensors(),
                                                    state_b = opt_b.state_tensors();
  ASSERT_EQ(state_a.size(), state_b.size());
  for (size_t i = 0; i < state_a.size(); ++i) {
    EXPECT_EQ(state_a[i].first, state_b[i].first);
    EXPECT_EQ(state_a[i].second.to_vector<double>(), state_b[i].second.to_vector<double>())
        << state_a[i].first;
  }
}

TEST(OptimizerState, SgdSaveLoadContinuesIdentically) {
  check_round_trip<Sgd>(SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true}, 8);
  check_round_trip<Sgd>(SgdOptions{.lr = 0.1}, 0);  // stateless
}

TEST(OptimizerState, AdamWSaveLoadContinuesIdentically) {
  check_round_trip<AdamW>(AdamWOptions{.lr = 0.01, .weight_decay = 0.05, .no_decay_bn_bias = true}, 12);
}

TEST(OptimizerState, StateNamesFollowParameterNames) {
  std::vector<NamedParameter> params = small_model();
  AdamW opt(params, AdamWOptions{});
  const auto state = opt.state_tensors();
  ASSERT_EQ(state.size(), 12u);
  EXPECT_EQ(state[0].first, "exp_avg.fc.weight");
  EXPECT_EQ(state[1].first, "exp_avg_sq.fc.weight");
  EXPECT_EQ(state[2].first, "step.fc.weight");
  EXPECT_EQ(state[0].second.shape(), (Shape{2, 2}));
  EXPECT_EQ(state[2].second.dtype(), DType::i64);
  EXPECT_EQ(state[2].second.item(), 0.0);
}

std::string load_error(Optimizer& opt, const std::vector<std::pair<std::string, Tensor>>& state) {
  try {
    opt.load_state(state, 1);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(OptimizerState, LoadRefusesMissingExtraAndMisShapedEntries) {
  std::vector<NamedParameter> params = small_model();
  Sgd opt(params, SgdOptions{.lr = 0.1, .momentum = 0.9});
  run_steps(opt, params, 0, 1);
  const auto good = opt.state_tensors();
  const Values before = values(params[0].param);

  auto missing = good;
  missing.erase(missing.begin() + 2);  // momentum_buffer.fc.bias
  EXPECT_NE(load_error(opt, missing).find("missing entry 'momentum_buffer.fc.bias'"), std::string::npos)
      << load_error(opt, missing);

  auto extra = good;
  extra.emplace_back("momentum_buffer.fc.gamma", Tensor::zeros({2}, DType::f64));
  EXPECT_NE(load_error(opt, extra).find("unexpected entry 'momentum_buffer.fc.gamma'"), std::string::npos)
      << load_error(opt, extra);

  auto misshaped = good;
  misshaped[0].second = Tensor::zeros({4}, DType::f64);
  EXPECT_NE(load_error(opt, misshaped).find("'momentum_buffer.fc.weight' has shape [4]"), std::string::npos)
      << load_error(opt, misshaped);

  auto duplicate = good;
  duplicate.push_back(good[0]);
  EXPECT_NE(load_error(opt, duplicate).find("duplicate entry 'momentum_buffer.fc.weight'"),
            std::string::npos);

  // A refused load changes nothing.
  EXPECT_EQ(opt.step_count(), 1);
  const auto after = opt.state_tensors();
  for (size_t i = 0; i < good.size(); ++i)
    EXPECT_EQ(after[i].second.to_vector<double>(), good[i].second.to_vector<double>());
  EXPECT_EQ(values(params[0].param), before);

  Sgd stateless(small_model(), SgdOptions{.lr = 0.1});
  EXPECT_NE(load_error(stateless, good).find("unexpected entry"), std::string::npos);
}

// ---- CUDA graphs: the host side of a replayed step

TEST(OptimizerReplayedSteps, CountAsTheLastStepCountedAndDeviceScalarsNeedAGpu) {
  std::vector<NamedParameter> params = small_model();
  AdamW opt(params, AdamWOptions{.lr = 0.01});
  set_grad(params[0].param, {1.0, 1.0, 1.0, 1.0});
  set_grad(params[2].param, {1.0, 1.0});  // fc.bias and bn.bias have no gradient
  opt.step();
  // A replay of that step updates the same two parameters on the device; the host counts them.
  opt.count_replayed_step();
  opt.count_replayed_step();
  EXPECT_EQ(opt.step_count(), 3);
  for (const auto& [name, t] : opt.state_tensors()) {
    if (name.rfind("step.", 0) != 0) continue;
    const bool stepped = name == "step.fc.weight" || name == "step.bn.weight";
    EXPECT_EQ(t.item(), stepped ? 3.0 : 0.0) << name;
  }
  // Device scalars are read by the CUDA kernels only: CPU parameters are refused, naming one.
  try {
    opt.use_device_scalars();
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'fc.weight' is on cpu"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(opt.uses_device_scalars());
  EXPECT_THROW(opt.stage_device_scalars(), std::logic_error);
}

// ---- Gradient clipping

TEST(OptimizerClipGradNorm, ReturnsTotalNormAndScales) {
  Variable a = make_param({0.0, 0.0}), b = make_param({0.0}), c = make_param({5.0});
  set_grad(a, {3.0, 4.0});
  set_grad(b, {12.0});  // total norm sqrt(9 + 16 + 144) = 13; c has no gradient
  const double norm = clip_grad_norm({a, b, c}, 6.5);
  EXPECT_DOUBLE_EQ(norm, 13.0);
  const double coef = 6.5 / (13.0 + 1e-6);
  expect_near(values(Variable(a.grad())), {3.0 * coef, 4.0 * coef}, 1e-15, "a.grad");
  expect_near(values(Variable(b.grad())), {12.0 * coef}, 1e-15, "b.grad");
  EXPECT_FALSE(c.grad().defined());

  // Below the limit: returned, gradients unchanged.
  set_grad(a, {3.0, 4.0});
  EXPECT_DOUBLE_EQ(clip_grad_norm({a}, 5.0 + 1e-3), 5.0);
  EXPECT_EQ(a.grad().to_vector<double>(), (Values{3.0, 4.0}));

  // f32 gradients; no gradients at all gives 0.
  Variable f = make_param({0.0, 0.0}, DType::f32);
  set_grad(f, {0.6, 0.8});
  EXPECT_NEAR(clip_grad_norm({f}, 0.5), 1.0, 1e-6);
  expect_near(values(Variable(f.grad())), {0.3, 0.4}, 1e-6, "f.grad");
  EXPECT_EQ(clip_grad_norm({c}, 1.0), 0.0);
  EXPECT_THROW(clip_grad_norm({a}, -1.0), std::invalid_argument);
}

}  // namespace
}  // namespace trainer
