// Training throughput on the GPU (forward + backward + SGD, images/s), printed for the record. Runs
// only when TRAINER_GPU_BENCH=1 so that the suite stays quick; it checks nothing but finiteness.
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "nn/cuda/caching_allocator.h"
#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/optim/sgd.h"
#include "tests/gpu/backend_options.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

double images_per_second(const std::string& name, int64_t batch, MemoryFormat format, bool tf32) {
  testing::set_backend_option(&runtime::BackendOptions::allow_tf32, tf32);
  ModelOptions o;
  o.name = name;
  o.stem = "cifar";
  o.image_size = 32;
  std::shared_ptr<Module> model = create_model(o);
  model->to(gpu());
  SgdOptions so;
  so.momentum = 0.9;
  Sgd opt(model->named_parameters(), so);
  Generator gen(1);
  Tensor x = Tensor::empty({batch, 3, 32, 32}, DType::f32, gpu(), format);
  x.copy_(random({batch, 3, 32, 32}, gen));
  std::vector<int64_t> t(static_cast<size_t>(batch));
  for (int64_t& v : t) v = static_cast<int64_t>(gen.below(10));
  const Tensor targets = Tensor::from_vector(t, {batch}).to(gpu());
  double last_loss = 0.0;
  auto step = [&] {
    Variable loss = F::cross_entropy((*model)(Variable(x)), targets, 0.1);
    loss.backward();
    opt.step();
    opt.zero_grad();
    return loss;
  };
  for (int i = 0; i < 3; ++i) step();
  cuda_synchronize();
  cuda_reset_peak_memory_stats();
  const int iters = 20;
  const auto start = std::chrono::steady_clock::now();
  Variable loss;
  for (int i = 0; i < iters; ++i) loss = step();
  last_loss = loss.item();  // synchronises
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(std::isfinite(last_loss));
  testing::set_backend_option(&runtime::BackendOptions::allow_tf32, false);
  const double ips = iters * batch / seconds;
  std::printf("%-9s batch %4lld %-13s %-4s %9.0f img/s  peak %6.0f MiB\n", name.c_str(),
              static_cast<long long>(batch), format == MemoryFormat::channels_last ? "channels_last" : "nchw",
              tf32 ? "tf32" : "fp32", ips,
              static_cast<double>(cuda_memory_stats().peak_allocated_bytes) / (1 << 20));
  return ips;
}

TEST(CudaThroughput, TrainingStepImagesPerSecond) {
  REQUIRE_GPU();
  const char* flag = std::getenv("TRAINER_GPU_BENCH");
  if (!flag || std::string(flag) != "1") GTEST_SKIP() << "set TRAINER_GPU_BENCH=1 to measure";
  images_per_second("cnn", 512, MemoryFormat::contiguous, false);
  for (int64_t batch : {128, 512}) {
    images_per_second("resnet18", batch, MemoryFormat::contiguous, false);
    images_per_second("resnet18", batch, MemoryFormat::contiguous, true);
    images_per_second("resnet18", batch, MemoryFormat::channels_last, true);
  }
}

}  // namespace
}  // namespace trainer
