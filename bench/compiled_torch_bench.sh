#!/usr/bin/env bash
# Issue 28's table in one run on a GPU host: our step (nn_bench replaying its CUDA graph, and the
# whole loop through `trainer bench` for resnet18-cifar) next to PyTorch eager (cuDNN autotuner, fused
# SGD) and torch.compile(mode="reduce-overhead") with fused SGD, bf16 channels-last: resnet18-cifar at
# batch 128 and 512, resnet50 (224x224) at 128 and 256. Each line: model batch input impl math layout
# img/s peak-MiB; PyTorch's compiled peak is max_memory_reserved() since process start.
#   bench/compiled_torch_bench.sh BIN_DIR OUT_DIR
set -u
B=${1:?BIN_DIR}; OUT=${2:?OUT_DIR}
mkdir -p "$OUT"
run() { "$@" 2>/dev/null | tail -1; }
{
  for b in 128 512; do
    run timeout 120 "$B/nn_bench" --model resnet18 --image 32 --channels 3 --batch $b --device cuda --math bf16 --layout cl --iters 100 --graph 1
    run timeout 120 python3 bench/torch_reference.py --model resnet18 --image 32 --channels 3 --batch $b --device cuda --dtype bf16 --channels-last --iters 100 --sgd fused
    run timeout 300 python3 bench/torch_reference.py --model resnet18 --image 32 --channels 3 --batch $b --device cuda --dtype bf16 --channels-last --iters 100 --compile
  done
  for b in 128 256; do
    run timeout 200 "$B/nn_bench" --model resnet50 --stem imagenet --image 224 --channels 3 --batch $b --device cuda --math bf16 --layout cl --iters 20 --graph 1
    run timeout 200 python3 bench/torch_reference.py --model resnet50 --stem imagenet --image 224 --channels 3 --batch $b --device cuda --dtype bf16 --channels-last --iters 20 --sgd fused
    run timeout 400 python3 bench/torch_reference.py --model resnet50 --stem imagenet --image 224 --channels 3 --batch $b --device cuda --dtype bf16 --channels-last --iters 20 --compile
  done
} | tee "$OUT/compiled_torch.txt"
echo "== trainer bench, resnet18-cifar bf16 (the whole loop), synthetic data"
timeout 200 "$B/trainer" bench configs/cifar10_resnet18.toml --procs 1 --precisions bf16 --batch 128,512 --steps 60 \
  --warmup 15 --data synthetic --set train.device=cuda --out /tmp/ctb 2>&1 | grep -v "^wrote" | tail -4 | tee -a "$OUT/compiled_torch.txt"
