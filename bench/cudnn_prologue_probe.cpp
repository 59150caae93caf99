// Does cuDNN pay for BatchNorm's normalisation + ReLU as the next convolution's prologue on this GPU?
// For each resnet18-cifar convolution that follows a BatchNorm + ReLU, at a batch size (channels-last,
// bf16 and f16), prints the convolution alone, ours (bn_apply, then the convolution; with and without
// the statistics after it) and the best engine cuDNN offers for the fused graph. See
// bench/cudnn/conv_prologue_probe.h.
//   cudnn_prologue_probe [--batch 512] [--dtype bf16|f16|both]
#include <vector>

#include "bench/conv_probe_layers.h"
#include "bench/cudnn/conv_prologue_probe.h"

int main(int argc, char** argv) {
  using namespace trainer;
  // The convolutions whose input is a BatchNorm + ReLU output: all but the stem (its input is the image).
  const std::vector<bench::ConvProbeLayer> all = bench::resnet18_cifar_convs();
  const std::vector<bench::ConvProbeLayer> layers(all.begin() + 1, all.end());
  return bench::run_conv_probe(argc, argv, layers, 62, bench::probe_conv_prologue_fusion);
}
