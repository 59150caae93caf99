// Does the trainer's convolution search miss a faster kernel on this GPU and cuDNN? For each
// convolution of resnet18-cifar at a batch size (channels-last, bf16 and f16), forward and both
// backwards, prints the pick of the trainer's search (the heuristics' first 10 configurations) and of
// the wide search (also mode B and the knob neighbours, up to 160). See
// bench/cudnn/knob_search_probe.h. This was TRAINER_CUDNN_SEARCH=wide inside the trainer.
//   cudnn_knob_probe [--batch 512] [--dtype bf16|f16|both]
#include "bench/conv_probe_layers.h"
#include "bench/cudnn/knob_search_probe.h"

int main(int argc, char** argv) {
  using namespace trainer;
  return bench::run_conv_probe(argc, argv, bench::resnet18_cifar_convs(), 34, bench::probe_knob_search);
}
