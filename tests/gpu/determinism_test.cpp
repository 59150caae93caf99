// train.deterministic on the GPU: two runs from the same seed give the same bits. resnet18 with the
// torchvision stem has an overlapping max-pool (3x3, stride 2), whose backward scatters with atomics.
#include <cstring>

#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/optim/sgd.h"
#include "tests/gpu/backend_options.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

struct RunResult {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
};

RunResult train(bool channels_last) {
  auto model = gpu_model("resnet18", 3, 64, "imagenet", 3);
  SgdOptions so;
  so.lr = 0.05, so.momentum = 0.9;
  Sgd opt(model->named_parameters(), so);
  Generator gen(8);
  RunResult r;
  for (int step = 0; step < 3; ++step) {
    const Tensor x = on_gpu(random({16, 3, 64, 64}, gen),
                            channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous);
    std::vector<int64_t> t(16);
    for (int64_t& v : t) v = static_cast<int64_t>(gen.below(10));
    Variable loss = F::cross_entropy((*model)(Variable(x)), Tensor::from_vector(t, {16}).to(gpu()));
    r.losses.push_back(loss.item());
    loss.backward();
    opt.step();
    opt.zero_grad();
  }
  for (const Variable& p : model->parameters()) r.weights.push_back(p.data().to_vector<float>());
  return r;
}

TEST(Deterministic, TwoRunsGiveTheSameBits) {
  REQUIRE_GPU();
  testing::set_backend_option(&runtime::BackendOptions::deterministic, true);
  for (bool cl : {false, true}) {
    const RunResult a = train(cl), b = train(cl);
    EXPECT_EQ(a.losses, b.losses) << (cl ? "channels-last" : "nchw");
    ASSERT_EQ(a.weights.size(), b.weights.size());
    for (size_t i = 0; i < a.weights.size(); ++i)
      EXPECT_EQ(0, std::memcmp(a.weights[i].data(), b.weights[i].data(), a.weights[i].size() * sizeof(float)))
          << "parameter " << i << (cl ? " channels-last" : " nchw");
  }
  testing::set_backend_option(&runtime::BackendOptions::deterministic, false);
}

TEST(Deterministic, MaxPoolBackwardMatchesTheCpuWithOverlappingWindows) {
  REQUIRE_GPU();
  testing::set_backend_option(&runtime::BackendOptions::deterministic, true);
  Generator gen(4);
  const Tensor x = random({2, 3, 9, 9}, gen);
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  const auto [y, idx] = cpu().max_pool2d(x, p);
  const Tensor g = random(y.shape(), gen);
  const auto [yg, idxg] = dev().max_pool2d(on_gpu(x), p);
  expect_close(cpu().max_pool2d_backward(g, idx, x.shape(), p),
               dev().max_pool2d_backward(on_gpu(g), idxg, x.shape(), p), 1e-6, 1e-7,
               "max_pool2d_backward, deterministic");
  testing::set_backend_option(&runtime::BackendOptions::deterministic, false);
}

}  // namespace
}  // namespace trainer
