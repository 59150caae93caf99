// Writes what scripts/torch_parity_ops.py needs to check the transformer ops against PyTorch in
// float64 on the CPU: for GELU (erf and tanh forms), layer norm (last dimension, and over the channels
// of a channels-last batch) and softmax, the inputs, the seed gradient, our outputs and our gradients,
// in OUT_DIR/ops.safetensors. Keys: "<op>.<tensor>", e.g. "layer_norm.grad_weight".
//   build/ops_parity OUT_DIR
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nn/functional.h"
#include "nn/random.h"
#include "nn/safetensors.h"

namespace {

using namespace trainer;
using Named = std::vector<std::pair<std::string, Tensor>>;

Tensor draw(const Shape& shape, Generator& gen, double lo, double hi) {
  Tensor t = Tensor::empty(shape, DType::f64);
  uniform_(t, lo, hi, gen);
  return t;
}

// Runs y = f(inputs), backward with `seed`, and records inputs, seed, y and every input's gradient.
void record(Named& out, const std::string& op, const std::vector<std::pair<std::string, Tensor>>& inputs,
            const std::function<Variable(const std::vector<Variable>&)>& f, Generator& gen) {
  std::vector<Variable> vars;
  for (const auto& [name, t] : inputs) vars.emplace_back(t.clone(), true);
  Variable y = f(vars);
  const Tensor seed = draw(y.shape(), gen, -1.0, 1.0);
  y.backward(seed);
  for (size_t i = 0; i < inputs.size(); ++i) {
    out.emplace_back(op + "." + inputs[i].first, inputs[i].second);
    out.emplace_back(op + ".grad_" + inputs[i].first, vars[i].grad().contiguous());
  }
  out.emplace_back(op + ".seed", seed);
  out.emplace_back(op + ".y", y.data().contiguous());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ops_parity OUT_DIR\n");
    return 2;
  }
  std::filesystem::create_directories(argv[1]);
  Generator gen(2024);
  Named out;
  record(
      out, "gelu", {{"x", draw({4, 33}, gen, -4.0, 4.0)}},
      [](const std::vector<Variable>& v) { return F::gelu(v[0]); }, gen);
  record(
      out, "gelu_tanh", {{"x", draw({4, 33}, gen, -4.0, 4.0)}},
      [](const std::vector<Variable>& v) { return F::gelu(v[0], F::GeluApproximation::tanh); }, gen);
  record(
      out, "layer_norm",
      {{"x", draw({3, 5, 37}, gen, -2.0, 3.0)},
       {"weight", draw({37}, gen, 0.5, 1.5)},
       {"bias", draw({37}, gen, -1.0, 1.0)}},
      [](const std::vector<Variable>& v) { return F::layer_norm(v[0], 37, v[1], v[2], 1e-5); }, gen);
  // x is [N, C, H, W]; PyTorch's reference is layer_norm over the last dimension of x.permute(0, 2, 3, 1).
  record(
      out, "layer_norm_channels",
      {{"x", draw({2, 7, 3, 5}, gen, -2.0, 3.0)},
       {"weight", draw({7}, gen, 0.5, 1.5)},
       {"bias", draw({7}, gen, -1.0, 1.0)}},
      [](const std::vector<Variable>& v) {
        return F::layer_norm(F::contiguous(v[0], MemoryFormat::channels_last), 7, v[1], v[2], 1e-6);
      },
      gen);
  record(
      out, "softmax", {{"x", draw({3, 5, 37}, gen, -20.0, 20.0)}},
      [](const std::vector<Variable>& v) { return F::softmax(v[0]); }, gen);
  const std::string path = std::string(argv[1]) + "/ops.safetensors";
  save_safetensors(path, out);
  std::printf("wrote %zu tensors to %s\n", out.size(), path.c_str());
  return 0;
}
