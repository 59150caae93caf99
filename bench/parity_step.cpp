// Writes everything a PyTorch parity check needs for one SGD step of resnet18-cifar:
//   init.safetensors   initial parameters and buffers (torchvision names)
//   batch.safetensors  images f32 [8, 3, 32, 32] and labels i64 [8]
//   step.safetensors   logits and loss of the forward pass, and every parameter and buffer after one
//                      SGD step (lr 0.1, momentum 0.9, weight decay 5e-4), prefixed "after."
// scripts/torch_parity.py replays the step in PyTorch (TF32 off) and compares.
//   build/parity_step OUT_DIR [cpu|cuda] [f32|f64]
// f64 (CPU only) computes the step in double precision: the comparison is then exact to ~1e-12 and
// cannot be decided by a ReLU mask that float32 rounding flips (scripts/torch_parity.py explains).
#include <cstdio>
#include <filesystem>
#include <string>

#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/optim/sgd.h"
#include "nn/random.h"
#include "nn/runtime.h"
#include "nn/safetensors.h"

int main(int argc, char** argv) {
  using namespace trainer;
  if (argc < 2) {
    std::fprintf(stderr, "usage: parity_step OUT_DIR [cpu|cuda]\n");
    return 2;
  }
  const std::string out = argv[1];
  const std::string device_name = argc > 2 ? argv[2] : "cpu";
  const std::string dtype_name = argc > 3 ? argv[3] : "f32";
  if (dtype_name != "f32" && dtype_name != "f64") {
    std::fprintf(stderr, "parity_step: dtype must be f32 or f64, got '%s'\n", dtype_name.c_str());
    return 2;
  }
  const DType dtype = dtype_name == "f64" ? DType::f64 : DType::f32;
  if (dtype == DType::f64 && device_name != "cpu") {
    std::fprintf(stderr, "parity_step: f64 runs on the CPU only\n");
    return 2;
  }
  std::filesystem::create_directories(out);
  Device device = Device::cpu();
  if (device_name != "cpu" && !runtime::cuda_built()) {
    std::fprintf(stderr, "parity_step: no CUDA backend in this build\n");
    return 1;
  }
  if (device_name == "cuda") {
    runtime::init_device(0);
    runtime::apply_backend_options({});  // TF32 off, as scripts/torch_parity.py runs PyTorch
    device = Device::cuda(0);
  }
  ModelOptions m;
  m.name = "resnet18";
  m.stem = "cifar";
  m.in_channels = 3;
  m.num_classes = 10;
  m.image_size = 32;
  m.seed = 0;
  auto model = create_model(m);
  save_module(out + "/init.safetensors", *model);

  Generator gen(123);
  Tensor images = Tensor::empty({8, 3, 32, 32});
  normal_(images, 0, 1, gen);
  std::vector<int64_t> labels(8);
  for (auto& l : labels) l = static_cast<int64_t>(gen.below(10));
  Tensor targets = Tensor::from_vector(labels, {8});
  save_safetensors(out + "/batch.safetensors", {{"images", images}, {"labels", targets}});

  model->to(device);
  model->to(dtype);
  model->train();
  SgdOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  so.weight_decay = 5e-4;
  Sgd opt(model->named_parameters(), so);
  Variable logits = (*model)(Variable(images.to(dtype).to(device)));
  Variable loss = F::cross_entropy(logits, targets.to(device));
  loss.backward();
  opt.step();

  std::vector<std::pair<std::string, Tensor>> results{{"logits", logits.data()}, {"loss", loss.data()}};
  for (const auto& e : model->state_dict()) results.emplace_back("after." + e.name, *e.tensor);
  save_safetensors(out + "/step.safetensors", results);
  std::printf("parity_step: loss %.6f on %s in %s, files in %s\n", loss.item(), device.str().c_str(),
              dtype_name.c_str(), out.c_str());
  return 0;
}
