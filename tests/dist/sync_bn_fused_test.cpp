// SyncBatchNorm's fused path (dist/sync_batch_norm.cpp over the Backend::sync_bn_* kernels) against
// the composition of generic ops it replaced (sync_bn_composed.h) and against BatchNorm2d: forced at
// world size 1 (sync_batch_norm called directly), across ranks with uneven and empty shards, by
// finite differences in f64, and refusing a global batch of one value per channel.
#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "dist/sync_batch_norm.h"
#include "multi_process.h"
#include "nn/functional.h"
#include "nn/random.h"
#include "sync_bn_composed.h"
#include "tests/nn/gradcheck.h"

namespace trainer {
namespace {

using namespace testing;

constexpr int64_t kC = 3;

using Forward = std::function<Variable(BatchNorm2d&, const Variable&)>;

Variable plain(BatchNorm2d& bn, const Variable& x) { return bn.forward(x); }

// A forward through `comm`: the fused path, or the composed one it replaced.
Forward fused(std::shared_ptr<Comm> comm) {
  return [comm](BatchNorm2d& bn, const Variable& x) { return sync_batch_norm(bn, x, comm); };
}
Forward composed(std::shared_ptr<Comm> comm) {
  return [comm](BatchNorm2d& bn, const Variable& x) { return composed_sync_batch_norm(bn, x, comm); };
}

// Rows [begin, end) of a [B, C, 3, 4] batch that differs per step; channel c is offset by 2c so
// that |mean| > std for some channels.
Tensor samples(int64_t begin, int64_t end, int step, double shift, DType dtype = DType::f32,
               MemoryFormat format = MemoryFormat::contiguous) {
  const int64_t per = kC * 3 * 4;
  std::vector<double> v(static_cast<size_t>((end - begin) * per));
  for (int64_t i = begin * per; i < end * per; ++i)
    v[i - begin * per] = std::sin(0.37 * i + shift + 5.0 * step) + 2.0 * ((i / 12) % kC);
  Tensor out = Tensor::empty({end - begin, kC, 3, 4}, dtype, Device::cpu(), format);
  out.copy_(Tensor::from_vector(v, {end - begin, kC, 3, 4}));
  return out;
}

void init_bn(BatchNorm2d& bn) {
  bn.weight().data().copy_(Tensor::from_vector<float>({1.5f, -0.5f, 0.8f}, {kC}));
  bn.bias().data().copy_(Tensor::from_vector<float>({0.1f, 0.2f, -0.3f}, {kC}));
  bn.running_mean().copy_(Tensor::from_vector<float>({0.3f, -0.2f, 0.0f}, {kC}));
  bn.running_var().copy_(Tensor::from_vector<float>({1.2f, 0.7f, 1.0f}, {kC}));
}

// Everything one training step of a layer produces: loss = sum(y * r).
struct Outputs {
  std::vector<double> y, grad_x, grad_w, grad_b, running_mean, running_var;
};

Outputs step(BatchNorm2d& bn, const Forward& f, const Tensor& x_data, const Tensor& r) {
  Variable x(x_data, true);
  bn.zero_grad();
  Variable y = f(bn, x);
  F::sum(F::mul(y, Variable(r))).backward();
  return {y.data().to_vector<double>(),           x.grad().to_vector<double>(),
          bn.weight().grad().to_vector<double>(), bn.bias().grad().to_vector<double>(),
          bn.running_mean().to_vector<double>(),  bn.running_var().to_vector<double>()};
}

// |got - want| <= tol * (1 + |want|) everywhere (thrown, so that ranks in child processes report it).
void check_near(const std::vector<double>& got, const std::vector<double>& want, double tol,
                const std::string& what) {
  if (got.size() != want.size()) throw std::runtime_error(what + ": sizes differ");
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= tol * (1.0 + std::abs(want[i]))))
      throw std::runtime_error(what + "[" + std::to_string(i) + "] = " + std::to_string(got[i]) + ", want " +
                               std::to_string(want[i]));
}

void check_near(const Outputs& got, const Outputs& want, double tol, const std::string& at) {
  check_near(got.y, want.y, tol, at + "y");
  check_near(got.grad_x, want.grad_x, tol, at + "grad x");
  check_near(got.grad_w, want.grad_w, tol, at + "grad weight");
  check_near(got.grad_b, want.grad_b, tol, at + "grad bias");
  check_near(got.running_mean, want.running_mean, tol, at + "running_mean");
  check_near(got.running_var, want.running_var, tol, at + "running_var");
}

// Two steps of `a` and `b` on the same batches (the second normalises after a running update).
void expect_same_steps(const Forward& a, const Forward& b, DType dtype, MemoryFormat format, double tol) {
  BatchNorm2d bn_a(kC), bn_b(kC);
  init_bn(bn_a);
  init_bn(bn_b);
  if (dtype == DType::f64) {
    bn_a.to(DType::f64);
    bn_b.to(DType::f64);
  }
  for (int s = 0; s < 2; ++s) {
    const Tensor x = samples(0, 5, s, 0.3, dtype, format), r = samples(0, 5, s, 1.7, dtype, format);
    const std::string at = std::string(dtype_name(dtype)) +
                           (format == MemoryFormat::channels_last ? " cl" : "") + " step " +
                           std::to_string(s) + " ";
    EXPECT_NO_THROW(check_near(step(bn_a, a, x, r), step(bn_b, b, x, r), tol, at));
  }
}

const MemoryFormat kFormats[] = {MemoryFormat::contiguous, MemoryFormat::channels_last};

// f32 tolerances: the fused path keeps the sums and the backward means in f64 where the composed
// one rounded them to f32 first, and BatchNorm2d divides f32 sums by the count.
TEST(SyncBnFused, ForcedAtWorldSizeOneIsBatchNorm2d) {
  const auto single = std::make_shared<SingleProcessComm>();
  for (MemoryFormat f : kFormats) {
    expect_same_steps(fused(single), plain, DType::f32, f, 2e-6);
    expect_same_steps(fused(single), plain, DType::f64, f, 1e-12);
  }
}

TEST(SyncBnFused, ForcedAtWorldSizeOneIsTheComposedPath) {
  const auto single = std::make_shared<SingleProcessComm>();
  for (MemoryFormat f : kFormats) {
    expect_same_steps(fused(single), composed(single), DType::f32, f, 2e-6);
    expect_same_steps(fused(single), composed(single), DType::f64, f, 1e-12);
  }
}

// Ranks with 4, 0 and 3 samples: the fused and the composed layer give the same outputs, gradients
// and running statistics on every rank, and those of one rank with all 7 samples. In f32 every path
// is ~1.5e-6 from the f64 result here (measured: fused 1.3e-6 to 2.0e-6, composed and BatchNorm2d
// 1.5e-6 to 1.9e-6), hence 1e-5 between them; in f64 they agree to rounding.
TEST(SyncBnFused, AcrossRanksWithUnevenAndEmptyShardsIsTheComposedPath) {
  const std::vector<int64_t> counts = {4, 0, 3};
  const int world = static_cast<int>(counts.size());
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
    const int port = free_port();
    const auto out = run_processes(world, [&](int rank) {
      Rank me(rank, world, port, 10s);
      const int64_t begin = std::accumulate(counts.begin(), counts.begin() + rank, int64_t{0});
      const int64_t end = begin + counts[rank], total = 7;
      BatchNorm2d a(kC), b(kC), whole(kC);
      for (BatchNorm2d* bn : {&a, &b, &whole}) {
        init_bn(*bn);
        bn->to(dtype);
      }
      for (int s = 0; s < 2; ++s) {
        const std::string at = std::string(dtype_name(dtype)) + " rank " + std::to_string(rank) + " step " +
                               std::to_string(s) + " ";
        const Tensor x = samples(begin, end, s, 0.3, dtype), r = samples(begin, end, s, 1.7, dtype);
        const Outputs got = step(a, fused(me.comm), x, r);
        check_near(got, step(b, composed(me.comm), x, r), tol, at);
        // Against the whole batch on one process: this rank's rows of y and grad_x.
        const Outputs ref =
            step(whole, plain, samples(0, total, s, 0.3, dtype), samples(0, total, s, 1.7, dtype));
        const size_t per = kC * 3 * 4;
        const std::vector<double> ref_y(ref.y.begin() + begin * per, ref.y.begin() + end * per);
        const std::vector<double> ref_gx(ref.grad_x.begin() + begin * per, ref.grad_x.begin() + end * per);
        check_near(got.y, ref_y, tol, at + "y against one rank");
        check_near(got.grad_x, ref_gx, tol, at + "grad x against one rank");
        check_near(got.running_mean, ref.running_mean, tol, at + "running_mean against one rank");
        check_near(got.running_var, ref.running_var, tol, at + "running_var against one rank");
      }
      me.comm->shutdown();
    });
    for (const auto& o : out) EXPECT_TRUE(o.ok()) << all_errors(out);
  }
}

// Channels-last inputs are covered by the comparisons above: the check perturbs a contiguous input.
TEST(SyncBnFused, GradcheckForcedAtWorldSizeOne) {
  const auto single = std::make_shared<SingleProcessComm>();
  BatchNorm2d bn(kC);
  init_bn(bn);
  bn.to(DType::f64);
  Generator gen(9);
  Variable x(random_tensor({3, kC, 2, 2}, gen), true);
  EXPECT_GRADCHECK([&](const std::vector<Variable>& in) { return sync_batch_norm(bn, in[0], single); },
                   {x, bn.weight(), bn.bias()});
}

// torch refuses a global batch of one value per channel; so does SyncBatchNorm, on the ranks that
// hold at most one value (they alone read the global count, so a rank with more never waits).
TEST(SyncBnFused, AGlobalBatchOfOneValueIsRefused) {
  const auto single = std::make_shared<SingleProcessComm>();
  BatchNorm2d bn(kC);
  try {
    sync_batch_norm(bn, Variable(Tensor::ones({1, kC, 1, 1})), single);
    FAIL() << "a batch of one value was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("expected more than 1 value per channel over all ranks, got 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(sync_batch_norm(bn, Variable(Tensor::ones({2, kC, 1, 1})), single));
  // One value on each of two ranks is a batch of two; one value and none is a batch of one.
  for (const std::vector<int64_t>& counts : {std::vector<int64_t>{1, 1}, std::vector<int64_t>{1, 0}}) {
    const int port = free_port();
    const bool refuse = counts[1] == 0;
    const auto out = run_processes(2, [&](int rank) {
      Rank me(rank, 2, port, 10s);
      BatchNorm2d layer(kC);
      bool refused = false;
      try {
        sync_batch_norm(layer, Variable(Tensor::ones({counts[rank], kC, 1, 1})), me.comm);
      } catch (const std::invalid_argument&) {
        refused = true;
      }
      if (refused != refuse) throw std::runtime_error(refuse ? "not refused" : "refused");
      me.comm->shutdown();
    });
    for (const auto& o : out) EXPECT_TRUE(o.ok()) << all_errors(out);
  }
}

// Running statistics in a half dtype (a model cast to it) move in f32 copies, then round.
TEST(SyncBnFused, HalfRunningStatisticsMove) {
  const auto single = std::make_shared<SingleProcessComm>();
  BatchNorm2d half(kC), ref(kC);
  init_bn(half);
  init_bn(ref);
  half.running_mean() = half.running_mean().to(DType::f16);
  half.running_var() = half.running_var().to(DType::f16);
  const Tensor x = samples(0, 4, 0, 0.3);
  sync_batch_norm(half, Variable(x), single);
  sync_batch_norm(ref, Variable(x), single);
  EXPECT_EQ(half.running_mean().dtype(), DType::f16);
  EXPECT_NO_THROW(check_near(half.running_mean().to_vector<double>(), ref.running_mean().to_vector<double>(),
                             1e-3, "running_mean"));
  EXPECT_NO_THROW(check_near(half.running_var().to_vector<double>(), ref.running_var().to_vector<double>(),
                             1e-3, "running_var"));
}

}  // namespace
}  // namespace trainer
