// Mixup/CutMix inside a captured CUDA graph: the kernels read the draws from the device, so a replay
// after BatchMixer::stage() mixes with the new draws -- each replay equals the CPU backend on the same
// draws, and two replays with different draws differ.
#include "nn/batch_mix.h"
#include "nn/cuda/cuda_graph.h"
#include "nn/functional.h"
#include "nn/training_loss.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

TEST(BatchMixGraph, ReplaysMixWithTheDrawsStagedBeforeThem) {
  REQUIRE_GPU();
  MixSettings s;
  s.mixup_alpha = 0.8;
  s.cutmix_alpha = 1.0;
  Generator gen(4);
  const Tensor host_images = random({8, 3, 16, 16}, gen, DType::f32);
  const Tensor host_labels = Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7}, {8});
  const Tensor images = on_gpu(host_images, MemoryFormat::channels_last), labels = on_gpu(host_labels);
  Tensor logits = on_gpu(random({8, 10}, gen, DType::f32));
  BatchMixer mixer(s, 21, gpu());
  const TrainingLoss loss{
      .kind = LossKind::bce, .label_smoothing = 0.1, .draws = &mixer.draws(), .mix_images = true};
  mixer.stage(0, 0, 16, 16);
  Tensor mixed, value;
  cuda::CudaGraph graph;
  graph.capture([&] {
    mixed = training_images(loss, images);
    value = training_loss(loss, Variable(logits), labels).data();
  });
  std::vector<double> previous;
  for (int64_t step = 1; step < 12; ++step) {
    mixer.stage(step, 0, 16, 16);  // a new draw into the same device tensor, then replay
    graph.replay();
    const Tensor draws = mixer.draws().to(Device::cpu());
    const Tensor expected = cpu().mix_images(host_images, draws);
    const std::vector<double> got = mixed.to(Device::cpu()).contiguous().to_vector<double>();
    const std::vector<double> want = expected.contiguous().to_vector<double>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-6) << "step " << step << " at " << i;
    const Tensor targets = cpu().mix_targets(host_labels, 10, 0.1, draws, DType::f32);
    const double cpu_loss = F::bce_with_logits(Variable(logits.to(Device::cpu())), targets).item();
    EXPECT_NEAR(value.item(), cpu_loss, 1e-6) << "step " << step;
    if (!previous.empty() && mixer.last().lambda < 1.0) {
      EXPECT_NE(got, previous);
    }
    previous = got;
  }
}

}  // namespace
}  // namespace trainer
