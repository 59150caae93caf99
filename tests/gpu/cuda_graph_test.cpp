// CUDA graphs (nn/cuda/cuda_graph.h): a captured training step replays to the eager step's losses
// bit for bit (train.deterministic, so that two eager runs agree too); memory the graph allocated is
// never handed to eager work; a step that waits for the device cannot be captured and says so.
#include "nn/cuda/cuda_graph.h"

#include "nn/amp/autocast.h"
#include "nn/cuda/caching_allocator.h"
#include "nn/functional.h"
#include "nn/optim/sgd.h"
#include "tests/gpu/backend_options.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/graph_steps.h"

namespace trainer {
namespace {

using namespace gpu_test;

// 50 SGD steps of resnet18-cifar on batches copied into the same device tensors each step; with
// `graph`, steps after the third replay a capture of the step instead of running it.
std::vector<double> losses(bool graph, std::optional<DType> half) {
  auto model = gpu_model("resnet18", 3, 32, "cifar", 5);
  SgdOptions so;
  so.lr = 0.05, so.momentum = 0.9, so.weight_decay = 5e-4;
  Sgd opt(model->named_parameters(), so);
  Generator gen(9);
  auto [x, y] = cifar_batch(gen, 16, half);
  Variable loss;
  auto step = [&] {
    loss = autocast_loss(*model, x, y, half);
    loss.backward();
    opt.step();
    opt.zero_grad();
  };
  return run_graph_steps({.steps = 50,
                          .capture_at = graph ? 3 : -1,
                          .load_batch =
                              [&](int) {
                                x.copy_(random(x.shape(), gen));  // the next batch into the step's inputs
                                random_labels(y, gen);
                              },
                          .step = step,
                          .loss = [&] { return loss.item(); }});
}

TEST(CudaGraph, ReplaysGiveTheEagerLossSequence) {
  REQUIRE_GPU();
  testing::set_backend_option(&runtime::BackendOptions::deterministic, true);
  for (std::optional<DType> half : {std::optional<DType>(), std::optional<DType>(DType::bf16)}) {
    const std::vector<double> eager = losses(false, half), replayed = losses(true, half);
    EXPECT_EQ(eager, replayed) << (half ? "bf16" : "fp32");
    EXPECT_NE(eager[10], eager[11]) << "each replay must read the batch copied in before it";
  }
  testing::set_backend_option(&runtime::BackendOptions::deterministic, false);
}

TEST(CudaGraph, MemoryOfTheGraphIsNotHandedToEagerWork) {
  REQUIRE_GPU();
  Generator gen(3);
  const Tensor x = on_gpu(random({1 << 16}, gen));
  Tensor doubled;
  cuda::CudaGraph g;
  g.capture([&] { doubled = dev().binary_scalar(BinaryOp::mul, x, 2.0, false); });
  g.replay();
  // Eager tensors of the same size, allocated and freed around replays, must not land on `doubled`
  // (nor on the graph's freed temporaries, which replays write).
  std::vector<Tensor> eager;
  for (int i = 0; i < 8; ++i) {
    eager.push_back(Tensor::full({1 << 16}, 7.0, DType::f32, gpu()));
    g.replay();
  }
  expect_close(dev().binary_scalar(BinaryOp::mul, x, 2.0, false), doubled, 0, 0, "graph output");
  for (const Tensor& t : eager) expect_close(Tensor::full({1 << 16}, 7.0), t, 0, 0, "eager tensor");
}

TEST(CudaGraph, AStepThatWaitsForTheDeviceIsNotCapturedAndSaysWhy) {
  REQUIRE_GPU();
  const Tensor x = Tensor::ones({4}, DType::f32, gpu());
  cuda::CudaGraph g;
  try {
    g.capture([&] { (void)dev().sum(dev().binary_scalar(BinaryOp::add, x, 1.0, false), {0}, false).item(); });
    ADD_FAILURE() << "a capture that reads a value on the host must fail";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(g.captured());
  // The stream works eagerly afterwards.
  EXPECT_EQ(dev().binary_scalar(BinaryOp::add, x, 1.0, false).to_vector<float>(),
            std::vector<float>({2, 2, 2, 2}));
}

}  // namespace
}  // namespace trainer
