// Loss and metrics, optimizer steps and dropout masks against the CPU backend.
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

Tensor random_targets(int64_t n, int64_t k, Generator& gen) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int64_t& v : t) v = static_cast<int64_t>(gen.below(static_cast<uint64_t>(k)));
  return Tensor::from_vector(t, {n});
}

TEST(CudaLoss, CrossEntropyWithSmoothingAndBackward) {
  REQUIRE_GPU();
  Generator gen(40);
  for (DType dtype : {DType::f32, DType::f64})
    for (int64_t K : {1, 10, 1000})
      for (double eps : {0.0, 0.1, 1.0}) {
        const double tol = dtype == DType::f32 ? 1e-5 : 1e-13;
        const int64_t N = 37;
        const Tensor logits = random({N, K}, gen, dtype, -8.0, 8.0), targets = random_targets(N, K, gen);
        const auto [loss, probs] = cpu().cross_entropy(logits, targets, eps);
        // Host targets and device targets give the same result.
        for (const Tensor& t : {targets, targets.to(gpu())}) {
          const auto [loss_g, probs_g] = dev().cross_entropy(logits.to(gpu()), t, eps);
          expect_close(loss, loss_g, tol, tol, "cross_entropy loss");
          expect_close(probs, probs_g, tol, tol * 1e-2, "cross_entropy probs");
        }
        const Tensor w = random({N}, gen, dtype);
        expect_close(cpu().cross_entropy_backward(w, probs, targets, eps),
                     dev().cross_entropy_backward(w.to(gpu()), probs.to(gpu()), targets.to(gpu()), eps), tol,
                     tol * 1e-2, "cross_entropy_backward");
      }
  // Strided logits, a NaN row, and a bad host target (an error, like the CPU).
  const Tensor logits = random({12, 5}, gen);
  const Tensor targets = random_targets(5, 12, gen);
  const Tensor lt = logits.permute({1, 0});
  expect_close(cpu().cross_entropy(lt, targets, 0.1).first,
               dev().cross_entropy(logits.to(gpu()).permute({1, 0}), targets, 0.1).first, 1e-5, 1e-6,
               "cross_entropy strided");
  const Tensor nan_logits = random({4, 6}, gen);
  Tensor nl = nan_logits.clone();
  nl.slice(0, 2, 3).slice(1, 4, 5).fill_(std::nan(""));
  const std::vector<double> l =
      dev().cross_entropy(nl.to(gpu()), random_targets(4, 6, gen), 0.0).first.to_vector<double>();
  EXPECT_TRUE(std::isnan(l[2]));
  EXPECT_FALSE(std::isnan(l[1]));
  EXPECT_THROW(
      dev().cross_entropy(nl.to(gpu()), Tensor::from_vector(std::vector<int64_t>{0, 1, 6, 2}, {4}), 0.0),
      std::invalid_argument);
  // A bad device target is not checked (that would stall the stream): the loss is NaN.
  const Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 1, 6, 2}, {4}).to(gpu());
  EXPECT_TRUE(std::isnan(dev().cross_entropy(nan_logits.to(gpu()), bad, 0.0).first.to_vector<double>()[2]));
}

TEST(CudaLoss, TopkAndArgmaxWithTiesAndNaN) {
  REQUIRE_GPU();
  Generator gen(41);
  for (DType dtype : {DType::f32, DType::f64}) {
    // Rounded logits make ties common.
    Tensor logits = random({200, 70}, gen, DType::f64, -3.0, 3.0);
    std::vector<double> v = logits.to_vector<double>();
    for (double& x : v) x = std::round(x);
    v[5 * 70 + 3] = std::nan("");
    v[9 * 70 + 0] = std::nan("");
    v[9 * 70 + 50] = std::nan("");
    logits = Tensor::from_vector(v, {200, 70}).to(dtype);
    const Tensor targets = random_targets(200, 70, gen);
    for (int k : {1, 3, 5})
      expect_equal(cpu().topk_correct(logits, targets, k),
                   dev().topk_correct(logits.to(gpu()), targets.to(gpu()), k), "topk_correct");
    expect_equal(cpu().argmax(logits), dev().argmax(logits.to(gpu())), "argmax");
    const Tensor wide = random({3, 5000}, gen, dtype);
    expect_equal(cpu().argmax(wide), dev().argmax(wide.to(gpu())), "argmax wide");
  }
}

TEST(CudaOptim, SgdStepVariants) {
  REQUIRE_GPU();
  Generator gen(42);
  std::vector<SgdParams> variants(4);
  variants[1].momentum = 0.9;
  variants[2].momentum = 0.9, variants[2].nesterov = true, variants[2].weight_decay = 5e-4;
  variants[3].momentum = 0.8, variants[3].dampening = 0.3, variants[3].weight_decay = 1e-2,
  variants[3].lr = 0.05;
  for (DType dtype : {DType::f32, DType::f64})
    for (const SgdParams& p : variants) {
      Tensor w = random({33, 17}, gen, dtype), buf = Tensor::zeros({33, 17}, dtype);
      Tensor wg = w.to(gpu()), bufg = buf.to(gpu());
      for (int step = 0; step < 4; ++step) {
        const Tensor g = random({17, 33}, gen, dtype).permute({1, 0});  // a strided gradient
        cpu().sgd_step(w, g, buf, step == 0, p);
        dev().sgd_step(wg, g.to(gpu()), bufg, step == 0, p);
      }
      const double tol = dtype == DType::f32 ? 1e-6 : 1e-14;
      expect_close(w, wg, tol, tol, "sgd param");
      if (p.momentum != 0.0) expect_close(buf, bufg, tol, tol, "sgd momentum buffer");
    }
}

// One launch for many parameters: 60 tensors (more than one launch takes), sizes from 1 element to
// several blocks' chunks, each with its own first step; the CPU updates them one by one.
TEST(CudaOptim, SgdStepManyEqualsTheCpuOneByOne) {
  REQUIRE_GPU();
  Generator gen(44);
  SgdParams p;
  p.lr = 0.05, p.momentum = 0.9, p.weight_decay = 1e-3, p.nesterov = true;
  std::vector<Tensor> w, buf, wg, bufg;
  for (int i = 0; i < 60; ++i) {
    const int64_t n = i % 7 == 0 ? 40000 + 13 * i : 1 + 37 * i;  // 40k spans three chunks of 16384
    w.push_back(random({n}, gen, DType::f32));
    buf.push_back(Tensor::zeros({n}, DType::f32));
    wg.push_back(w.back().to(gpu()));
    bufg.push_back(buf.back().to(gpu()));
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> g, gg;
    gg.reserve(w.size());  // updates point into gg
    std::vector<Backend::SgdUpdate> updates;
    for (size_t i = 0; i < w.size(); ++i) {
      g.push_back(random(w[i].shape(), gen, DType::f32));
      gg.push_back(g.back().to(gpu()));
      const bool first = step == 0 || (step == 1 && i % 2 == 1);  // odd ones start a step later
      if (step == 0 && i % 2 == 1) continue;
      cpu().sgd_step(w[i], g[i], buf[i], first, p);
      updates.push_back({&wg[i], &gg[i], &bufg[i], first});
    }
    dev().sgd_step_many(updates, p);
  }
  for (size_t i = 0; i < w.size(); ++i) {
    expect_close(w[i], wg[i], 1e-6, 1e-6, "sgd_step_many param " + std::to_string(i));
    expect_close(buf[i], bufg[i], 1e-6, 1e-6, "sgd_step_many buffer " + std::to_string(i));
  }
}

// The 16-byte path (every operand aligned) and the element path (a launch holding an offset view,
// whose data is not 16-byte aligned) give the same bits, sizes with a tail that is not a whole pack
// included.
TEST(CudaOptim, SgdVectorisedAndElementwiseUpdatesAreBitwiseEqual) {
  REQUIRE_GPU();
  Generator gen(45);
  SgdParams p;
  p.lr = 0.05, p.momentum = 0.9, p.weight_decay = 1e-3, p.nesterov = true;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1029}, int64_t{40003}}) {
    const Tensor w0 = random({n}, gen, DType::f32), g = random({n}, gen, DType::f32).to(gpu());
    // Aligned: a tensor of its own. Unaligned: elements 1..n of a larger one.
    Tensor wa = w0.to(gpu()), ba = Tensor::zeros({n}, DType::f32, gpu());
    Tensor big_w = Tensor::zeros({n + 1}, DType::f32, gpu()),
           big_b = Tensor::zeros({n + 1}, DType::f32, gpu());
    Tensor wu = big_w.slice(0, 1, n + 1), bu = big_b.slice(0, 1, n + 1);
    wu.copy_(w0);
    for (int step = 0; step < 2; ++step) {
      dev().sgd_step_many({{&wa, &g, &ba, step == 0}}, p);
      dev().sgd_step_many({{&wu, &g, &bu, step == 0}}, p);
    }
    EXPECT_EQ(wa.to(Device::cpu()).to_vector<float>(), wu.to(Device::cpu()).to_vector<float>()) << n;
    EXPECT_EQ(ba.to(Device::cpu()).to_vector<float>(), bu.to(Device::cpu()).to_vector<float>()) << n;
  }
}

TEST(CudaOptim, AdamWSteps) {
  REQUIRE_GPU();
  Generator gen(43);
  for (DType dtype : {DType::f32, DType::f64})
    for (double beta1 : {0.9, 0.3}) {
      AdamWParams p;
      p.lr = 1e-2, p.beta1 = beta1, p.weight_decay = 0.05;
      Tensor w = random({4, 3, 3, 5}, gen, dtype), m = Tensor::zeros(w.shape(), dtype),
             v = Tensor::zeros(w.shape(), dtype);
      Tensor wg = w.to(gpu()), mg = m.to(gpu()), vg = v.to(gpu());
      for (int64_t step = 1; step <= 5; ++step) {
        p.step = step;
        const Tensor g = random(w.shape(), gen, dtype);
        cpu().adamw_step(w, g, m, v, p);
        dev().adamw_step(wg, g.to(gpu()), mg, vg, p);
      }
      const double tol = dtype == DType::f32 ? 1e-5 : 1e-13;
      expect_close(w, wg, tol, tol, "adamw param");
      expect_close(m, mg, tol, tol, "adamw exp_avg");
      expect_close(v, vg, tol, tol, "adamw exp_avg_sq");
    }
}

// One launch per 36 tensors: 80 parameters (three launches), some spanning several chunks, half of
// them a step behind the rest (a group whose backbone was frozen for a while), each with its own bias
// correction, against the CPU's one-by-one updates.
TEST(CudaOptim, AdamWStepManyEqualsTheCpuOneByOne) {
  REQUIRE_GPU();
  Generator gen(46);
  AdamWParams p;
  p.lr = 1e-2, p.weight_decay = 0.05;
  std::vector<Tensor> w, m, v, wg, mg, vg;
  for (int i = 0; i < 80; ++i) {
    const int64_t n = i % 9 == 0 ? 40000 + 13 * i : 1 + 37 * i;  // 40k spans three chunks of 16384
    w.push_back(random({n}, gen, DType::f32));
    m.push_back(Tensor::zeros({n}, DType::f32));
    v.push_back(Tensor::zeros({n}, DType::f32));
    wg.push_back(w.back().to(gpu()));
    mg.push_back(m.back().to(gpu()));
    vg.push_back(v.back().to(gpu()));
  }
  std::vector<int64_t> steps(w.size(), 0);
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> g, gg;
    gg.reserve(w.size());  // updates point into gg
    std::vector<Backend::AdamWUpdate> updates;
    for (size_t i = 0; i < w.size(); ++i) {
      g.push_back(random(w[i].shape(), gen, DType::f32));
      gg.push_back(g.back().to(gpu()));
      if (step == 0 && i % 2 == 1) continue;  // odd ones start a step later
      AdamWParams each = p;
      each.step = ++steps[i];
      cpu().adamw_step(w[i], g[i], m[i], v[i], each);
      updates.push_back({&wg[i], &gg[i], &mg[i], &vg[i], steps[i], nullptr, nullptr});
    }
    dev().adamw_step_many(updates, p);
  }
  for (size_t i = 0; i < w.size(); ++i) {
    expect_close(w[i], wg[i], 1e-5, 1e-5, "adamw_step_many param " + std::to_string(i));
    expect_close(m[i], mg[i], 1e-5, 1e-5, "adamw_step_many exp_avg " + std::to_string(i));
    expect_close(v[i], vg[i], 1e-5, 1e-5, "adamw_step_many exp_avg_sq " + std::to_string(i));
  }
}

// A device loss scaler's skips: the kernel leaves everything as it is while the flag is set, and the
// bias correction uses the device count of applied updates (count_updates advances it unless skipped),
// as the CPU backend with the same flag and count.
TEST(CudaOptim, AdamWSkipsOnTheFlagAndCountsAppliedSteps) {
  REQUIRE_GPU();
  Generator gen(44);
  AdamWParams p;
  p.lr = 1e-2, p.weight_decay = 0.05;
  Tensor w = random({4, 3, 3, 5}, gen, DType::f32), m = Tensor::zeros(w.shape()),
         v = Tensor::zeros(w.shape());
  Tensor wg = w.to(gpu()), mg = m.to(gpu()), vg = v.to(gpu());
  Tensor flag = Tensor::zeros({1}, DType::i64), count = Tensor::zeros({3}, DType::i64);
  Tensor flag_g = flag.to(gpu()), count_g = count.to(gpu());
  for (int64_t step = 1; step <= 6; ++step) {
    const bool skip = step == 1 || step == 4;
    flag.fill_(skip ? 1 : 0);
    flag_g.fill_(skip ? 1 : 0);
    p.step = step;  // the host's count (skips included): ignored in favour of the applied count
    const Tensor g = random(w.shape(), gen, DType::f32);
    p.skip_if = flag.data<int64_t>();
    p.applied_steps = count.data<int64_t>() + 1;
    cpu().adamw_step(w, g, m, v, p);
    cpu().count_updates(count, {1}, p.skip_if);
    p.skip_if = static_cast<const int64_t*>(flag_g.raw_data());
    p.applied_steps = static_cast<const int64_t*>(count_g.raw_data()) + 1;
    dev().adamw_step(wg, g.to(gpu()), mg, vg, p);
    dev().count_updates(count_g, {1}, p.skip_if);
  }
  EXPECT_EQ(count.to_vector<int64_t>(), (std::vector<int64_t>{0, 4, 0}));
  EXPECT_EQ(count_g.to_vector<int64_t>(), (std::vector<int64_t>{0, 4, 0}));
  expect_close(w, wg, 1e-5, 1e-5, "adamw param");
  expect_close(m, mg, 1e-5, 1e-5, "adamw exp_avg");
  expect_close(v, vg, 1e-5, 1e-5, "adamw exp_avg_sq");
}

TEST(CudaRandom, DropoutMaskEqualsTheCpuMask) {
  REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    Generator a(7), b(7);
    const Tensor expected = cpu().dropout_mask({13, 29}, 0.3, dtype, a);
    const Tensor actual = dev().dropout_mask({13, 29}, 0.3, dtype, b);
    EXPECT_TRUE(actual.device().is_cuda());
    expect_equal(expected, actual, "dropout mask");
    EXPECT_EQ(a.state(), b.state());
  }
}

}  // namespace
}  // namespace trainer
