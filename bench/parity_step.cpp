// Writes everything a PyTorch parity check needs for one training step of a model:
//   init.safetensors   initial parameters and buffers (torchvision names); metadata "model" names the
//                      architecture for scripts/torch_parity.py
//   batch.safetensors  images f32 [8, 3, 32, 32] and labels i64 [8]
//   step.safetensors   logits and loss of the forward pass, every parameter's gradient ("grad."), and
//                      every parameter and buffer after the optimizer step ("after.")
// The models and optimizers:
//   resnet18  resnet18-cifar, SGD (lr 0.1, momentum 0.9, weight decay 5e-4)
//   vit       a small ViT (32x32, patch 4, 2 layers, 4 heads, width 32, MLP 64), AdamW
//   convnext  a small ConvNeXt (patch-2 stem, depths 1/1/2/1, widths 16/32/48/64, layer scale 0.5), AdamW
// AdamW: lr 1e-3, weight decay 0.05, none on norms, biases, the class token, position embedding and
// layer scales (optim.no_decay_bn_bias). Initial weights that torchvision sets to one constant (zero
// heads, the class token, LayerNorm's ones and zeros) get seeded noise, so that every gradient counts.
// scripts/torch_parity.py replays the step in PyTorch (TF32 off) and compares.
//   build/parity_step OUT_DIR [cpu|cuda] [f32|f64] [resnet18|vit|convnext]
// f64 (CPU only) computes the step in double precision: the comparison is then exact to ~1e-12 and
// cannot be decided by a ReLU mask that float32 rounding flips (scripts/torch_parity.py explains).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "nn/functional.h"
#include "nn/models/registry.h"
#include "nn/optim/adamw.h"
#include "nn/optim/sgd.h"
#include "nn/random.h"
#include "nn/runtime.h"
#include "nn/safetensors.h"

namespace {

using namespace trainer;

ModelOptions parity_model(const std::string& name) {
  ModelOptions m;
  m.name = name;
  if (name == "resnet18") m.stem = "cifar";
  m.in_channels = 3;
  m.num_classes = 10;
  m.image_size = 32;
  m.seed = 0;
  if (name == "vit") {
    m.patch_size = 4;
    m.depth = 2;
    m.heads = 4;
    m.width = 32;
    m.mlp_dim = 64;
  } else if (name == "convnext") {
    m.depths = {1, 1, 2, 1};
    m.widths = {16, 32, 48, 64};
    m.stem_patch = 2;
    m.drop_path = 0.0;
    m.layer_scale = 0.5;
  } else if (name != "resnet18") {
    throw std::invalid_argument("parity_step: model is resnet18, vit or convnext, not '" + name + "'");
  }
  return m;
}

// Seeded noise on every parameter that starts as one constant, so the step's check sees each gradient.
void perturb_constant_parameters(Module& model, Generator& gen) {
  for (NamedParameter& p : model.named_parameters()) {
    Tensor& t = p.param.data();
    const Tensor flat = t.contiguous().reshape({t.numel()});
    const std::vector<float> v = flat.to_vector<float>();
    if (v.size() > 1 && std::any_of(v.begin(), v.end(), [&](float x) { return x != v[0]; })) continue;
    Tensor noise = Tensor::empty(t.shape());
    normal_(noise, 0.0, 0.05, gen);
    t.copy_(F::add(Variable(t), Variable(noise)).data());
  }
}

std::unique_ptr<Optimizer> parity_optimizer(const std::string& name, Module& model) {
  if (name == "resnet18") {
    SgdOptions so;
    so.lr = 0.1;
    so.momentum = 0.9;
    so.weight_decay = 5e-4;
    return std::make_unique<Sgd>(model.named_parameters(), so);
  }
  AdamWOptions ao;
  ao.lr = 1e-3;
  ao.weight_decay = 0.05;
  ao.no_decay_bn_bias = true;
  return std::make_unique<AdamW>(model.named_parameters(), ao);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: parity_step OUT_DIR [cpu|cuda] [f32|f64] [resnet18|vit|convnext]\n");
    return 2;
  }
  const std::string out = argv[1];
  const std::string device_name = argc > 2 ? argv[2] : "cpu";
  const std::string dtype_name = argc > 3 ? argv[3] : "f32";
  const std::string model_name = argc > 4 ? argv[4] : "resnet18";
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
  auto model = create_model(parity_model(model_name));
  Generator gen(123);
  if (model_name != "resnet18") perturb_constant_parameters(*model, gen);
  save_module(out + "/init.safetensors", *model, {{"model", model_name}});

  Tensor images = Tensor::empty({8, 3, 32, 32});
  normal_(images, 0, 1, gen);
  std::vector<int64_t> labels(8);
  for (auto& l : labels) l = static_cast<int64_t>(gen.below(10));
  Tensor targets = Tensor::from_vector(labels, {8});
  save_safetensors(out + "/batch.safetensors", {{"images", images}, {"labels", targets}});

  model->to(device);
  model->to(dtype);
  model->train();
  std::unique_ptr<Optimizer> opt = parity_optimizer(model_name, *model);
  Variable logits = (*model)(Variable(images.to(dtype).to(device)));
  Variable loss = F::cross_entropy(logits, targets.to(device));
  loss.backward();
  std::vector<std::pair<std::string, Tensor>> results{{"logits", logits.data()}, {"loss", loss.data()}};
  for (const NamedParameter& p : model->named_parameters())
    results.emplace_back("grad." + p.name, p.param.grad().clone());
  opt->step();

  for (const auto& e : model->state_dict()) results.emplace_back("after." + e.name, *e.tensor);
  save_safetensors(out + "/step.safetensors", results);
  std::printf("parity_step: %s loss %.6f on %s in %s, files in %s\n", model_name.c_str(), loss.item(),
              device.str().c_str(), dtype_name.c_str(), out.c_str());
  return 0;
}
