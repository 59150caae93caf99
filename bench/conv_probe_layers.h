#pragma once
// The loop the convolution probes share (bench/cudnn_fusion_probe, bench/cudnn_prologue_probe,
// bench/cudnn_knob_probe): for each dtype the command line wants, each of the given
// resnet18-cifar convolutions at --batch, run one probe and print its rows. CUDA builds only.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "bench/cudnn/conv_probe_row.h"
#include "bench/probe_args.h"
#include "nn/cuda/cuda_backend.h"

namespace trainer::bench {

struct ConvProbeLayer {
  const char* name;
  int64_t c, hw, k, r, stride;  // input channels, input size, output channels, kernel size, stride
};

// resnet18-cifar's distinct convolutions (3x3), each followed by a BatchNorm; the first is the stem.
inline std::vector<ConvProbeLayer> resnet18_cifar_convs() {
  return {{"stem 3->64 32x32", 3, 32, 64, 3, 1},      {"layer1 64->64 32x32", 64, 32, 64, 3, 1},
          {"layer2 64->128 s2", 64, 32, 128, 3, 2},   {"layer2 128->128 16x16", 128, 16, 128, 3, 1},
          {"layer3 256->256 8x8", 256, 8, 256, 3, 1}, {"layer4 512->512 4x4", 512, 4, 512, 3, 1}};
}

// The whole probe: reads the command line (bench/probe_args.h), selects GPU 0, and runs
// probe(dtype, x shape, w shape, params) -> the rows to print; `name_width` pads the row names.
template <class Probe>
int run_conv_probe(int argc, char** argv, const std::vector<ConvProbeLayer>& layers, int name_width,
                   Probe probe) {
  const ProbeArgs args = parse_probe_args(argc, argv);
  init_cuda_backend(0);
  for (DType dtype : {DType::bf16, DType::f16}) {
    if (!args.wants(std::string(dtype_name(dtype)))) continue;
    for (const ConvProbeLayer& l : layers) {
      Conv2dParams p;
      p.stride_h = p.stride_w = static_cast<int>(l.stride);
      p.pad_h = p.pad_w = static_cast<int>(l.r / 2);
      std::printf("%s batch %d %s\n", std::string(dtype_name(dtype)).c_str(), args.batch, l.name);
      try {
        for (const ConvProbeRow& row :
             probe(dtype, Shape{args.batch, l.c, l.hw, l.hw}, Shape{l.k, l.c, l.r, l.r}, p))
          std::printf("  %-*s engines %2d runnable %2d best %8.4f ms (engine %lld) %s\n", name_width,
                      row.pattern.c_str(), row.engines, row.runnable, row.best_ms,
                      static_cast<long long>(row.best_engine), row.note.c_str());
      } catch (const std::exception& e) {
        std::printf("  error: %s\n", e.what());
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace trainer::bench
