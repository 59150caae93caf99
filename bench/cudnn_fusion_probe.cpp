// Does cuDNN fusion pay for BatchNorm's forward statistics on this GPU? For each convolution of
// resnet18-cifar at a batch size (channels-last, bf16 and f16), prints the time of the convolution
// alone, of our statistics kernel alone, and of the best engine cuDNN offers for the convolution with
// the per-channel sum and sum of squares fused into its epilogue (the dedicated genstats operation and
// the generic reductions of runtime fusion). See nn/cuda/conv_stats_fusion_probe.h.
//   cudnn_fusion_probe [--batch 512] [--dtype bf16|f16|both]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench/probe_args.h"

#ifdef TRAINER_WITH_CUDA
#include "bench/conv_probe_layers.h"
#include "nn/cuda/conv_stats_fusion_probe.h"
#include "nn/cuda/cuda_backend.h"
#endif

int main(int argc, char** argv) {
  const trainer::bench::ProbeArgs args = trainer::bench::parse_probe_args(argc, argv);
#ifndef TRAINER_WITH_CUDA
  (void)args;
  std::fprintf(stderr, "%s needs a CUDA build of the trainer\n", "cudnn_fusion_probe");
  return 2;
#else
  using namespace trainer;
  init_cuda_backend(0);
  // resnet18-cifar's distinct convolutions (3x3 unless noted) with a BatchNorm after each.
  return bench::run_conv_probe(args,
                               {{"stem 3->64 32x32", 3, 32, 64, 3, 1},
                                {"layer1 64->64 32x32", 64, 32, 64, 3, 1},
                                {"layer2 64->128 s2", 64, 32, 128, 3, 2},
                                {"layer2 128->128 16x16", 128, 16, 128, 3, 1},
                                {"layer3 256->256 8x8", 256, 8, 256, 3, 1},
                                {"layer4 512->512 4x4", 512, 4, 512, 3, 1}},
                               48, [](DType dtype, const Shape& x, const Shape& w, const Conv2dParams& p) {
                                 return cuda::probe_conv_stats_fusion(dtype, x, w, p);
                               });
#endif
}
