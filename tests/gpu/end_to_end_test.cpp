// A few SGD steps of the reference `cnn` model on the GPU give the CPU's losses and weights.
#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/optim/sgd.h"
#include "tests/gpu/backend_options.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

std::vector<double> train_cnn(Device device, MemoryFormat format, std::vector<double>* final_weights) {
  ModelOptions o;
  o.name = "cnn";
  o.in_channels = 1;
  o.image_size = 16;
  o.num_classes = 10;
  o.seed = 5;
  o.dropout = 0.25;  // masks are drawn on the host, so both devices drop the same units
  std::shared_ptr<Module> model = create_model(o);
  model->to(device);
  SgdOptions so;
  so.lr = 0.05, so.momentum = 0.9, so.nesterov = true, so.weight_decay = 5e-4;
  Sgd opt(model->named_parameters(), so);
  Generator data(99);
  std::vector<double> losses;
  for (int step = 0; step < 5; ++step) {
    const Tensor x = random({16, 1, 16, 16}, data);
    std::vector<int64_t> t(16);
    for (int64_t& v : t) v = static_cast<int64_t>(data.below(10));
    const Tensor targets = Tensor::from_vector(t, {16});
    Tensor xd = Tensor::empty(x.shape(), DType::f32, device, format);
    xd.copy_(x);
    Variable loss = F::cross_entropy((*model)(Variable(xd)), targets.to(device), 0.1);
    losses.push_back(loss.item());
    loss.backward();
    opt.step();
    opt.zero_grad();
  }
  for (const auto& nt : model->state_dict())
    for (double v : nt.tensor->to_vector<double>()) final_weights->push_back(v);
  return losses;
}

TEST(CudaEndToEnd, CnnSgdStepsMatchTheCpu) {
  REQUIRE_GPU();
  testing::set_backend_option(&runtime::BackendOptions::allow_tf32, false);
  std::vector<double> w_cpu, w_gpu, w_gpu_cl;
  const std::vector<double> cpu_losses = train_cnn(Device::cpu(), MemoryFormat::contiguous, &w_cpu);
  const std::vector<double> gpu_losses = train_cnn(gpu(), MemoryFormat::contiguous, &w_gpu);
  const std::vector<double> cl_losses = train_cnn(gpu(), MemoryFormat::channels_last, &w_gpu_cl);
  ASSERT_EQ(cpu_losses.size(), gpu_losses.size());
  for (size_t i = 0; i < cpu_losses.size(); ++i) {
    EXPECT_NEAR(cpu_losses[i], gpu_losses[i], 1e-4 * std::abs(cpu_losses[i])) << "step " << i;
    EXPECT_NEAR(cpu_losses[i], cl_losses[i], 1e-4 * std::abs(cpu_losses[i]))
        << "step " << i << " channels_last";
  }
  ASSERT_EQ(w_cpu.size(), w_gpu.size());
  int bad = 0;
  for (size_t i = 0; i < w_cpu.size(); ++i)
    if (std::abs(w_cpu[i] - w_gpu[i]) > 1e-4 * (1.0 + std::abs(w_cpu[i]))) ++bad;
  EXPECT_EQ(bad, 0) << "weights differ after 5 steps";
}

}  // namespace
}  // namespace trainer
