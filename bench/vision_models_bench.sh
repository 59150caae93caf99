#!/usr/bin/env bash
# Issue 38's table in one run on a GPU host: ViT-B/16, ViT-S/16 and ConvNeXt-T, bf16, 224x224, AdamW,
# 1000 classes, at batch 128 and 256. Our step (nn_bench replaying its CUDA graph) next to torchvision's
# same models in PyTorch eager (fused AdamW, cuDNN autotuner) and under
# torch.compile(mode="reduce-overhead") with fused AdamW. Each line: model batch input impl math layout
# img/s peak-MiB (PyTorch's compiled peak is max_memory_reserved() since process start).
#   bench/vision_models_bench.sh BIN_DIR OUT_DIR [ours,eager,compiled] [MODELS] [BATCHES]
set -u
B=${1:?BIN_DIR}; OUT=${2:?OUT_DIR}; SIDES=${3:-ours,eager,compiled}
MODELS=${4:-vit_b_16 vit_s_16 convnext_tiny}; BATCHES=${5:-128 256}
mkdir -p "$OUT"
run() { "$@" 2>/dev/null | tail -1; }
common="--image 224 --channels 3 --classes 1000 --optim adamw --layout cl"
for m in $MODELS; do
  for b in $BATCHES; do
    [[ $SIDES == *ours* ]] && run timeout 240 "$B/nn_bench" --model $m --batch $b --device cuda --math bf16 \
      --iters 30 --graph 1 $common
    [[ $SIDES == *eager* ]] && run timeout 240 python3 bench/torch_reference.py --model $m --batch $b --image 224 \
      --channels 3 --classes 1000 --optim adamw --device cuda --dtype bf16 --channels-last --iters 30 --sgd fused
    [[ $SIDES == *compiled* ]] && run timeout 500 python3 bench/torch_reference.py --model $m --batch $b --image 224 \
      --channels 3 --classes 1000 --optim adamw --device cuda --dtype bf16 --channels-last --iters 30 --compile
  done
done | tee -a "$OUT/vision_models.txt"
