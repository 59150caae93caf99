// Does cuDNN fusion pay for BatchNorm's forward statistics on this GPU? For each convolution of
// resnet18-cifar at a batch size (channels-last, bf16 and f16), prints the time of the convolution
// alone, of our statistics kernel alone, and of the best engine cuDNN offers for the convolution with
// the per-channel sum and sum of squares fused into its epilogue (the dedicated genstats operation and
// the generic reductions of runtime fusion). See bench/cudnn/conv_stats_fusion_probe.h.
//   cudnn_fusion_probe [--batch 512] [--dtype bf16|f16|both]
#include "bench/conv_probe_layers.h"
#include "bench/cudnn/conv_stats_fusion_probe.h"

int main(int argc, char** argv) {
  using namespace trainer;
  return bench::run_conv_probe(argc, argv, bench::resnet18_cifar_convs(), 48, bench::probe_conv_stats_fusion);
}
