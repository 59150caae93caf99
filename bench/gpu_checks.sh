#!/usr/bin/env bash
# Every GPU measurement the notes quote, in one run on a GPU host, each trainer figure next to the
# PyTorch figure measured in the same run. Usage, from the repository root on the GPU host:
#   bench/gpu_checks.sh BIN_DIR FASHION_MNIST_DIR OUT_DIR [sections...]
# BIN_DIR holds trainer, gpu_tests, nn_bench and parity_step (../shared/gpu/pack makes such a bundle;
# source its env.sh first). Sections (default: all): tests parity throughput fmnist bench plan resume.
# Results go to OUT_DIR as text; keep the copies under bench/results/.
set -u
B=${1:?BIN_DIR}; FM=${2:?FASHION_MNIST_DIR}; OUT=${3:?OUT_DIR}; shift 3
SECTIONS=${*:-tests parity throughput fmnist bench plan resume trace}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
torch_version=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
echo "PyTorch $torch_version" | tee -a "$OUT/gpu.txt"

if want tests; then
  echo "== gpu_tests"
  "$B/gpu_tests" --gtest_brief=1 > "$OUT/gpu_tests.txt" 2>&1
  grep -E "FAILED|PASSED|tests ran" "$OUT/gpu_tests.txt"
fi

if want parity; then
  echo "== one SGD step of resnet18-cifar vs PyTorch (TF32 off)"
  "$B/parity_step" /tmp/parity cuda && python3 scripts/torch_parity.py /tmp/parity --device cuda 2>&1 | tee "$OUT/parity_cuda.txt"
fi

if want throughput; then
  echo "== throughput: resnet18-cifar and resnet50-224, ours eager, ours replaying a CUDA graph, PyTorch eager"
  # fp16 is not captured: the loss scaler's skip decision is a host read (nn_bench says so and times
  # eager steps). Each line: model batch input device math layout img/s peak-MiB.
  {
    for b in 128 512; do for m in fp32 tf32 bf16 fp16; do
      layout=nchw; flag=""
      if [[ $m == bf16 || $m == fp16 ]]; then layout=cl; flag=--channels-last; fi
      timeout 120 "$B/nn_bench" --model resnet18 --image 32 --channels 3 --batch $b --device cuda --math $m --layout $layout --iters 40 2>/dev/null | tail -1
      [[ $m != fp16 ]] && timeout 120 "$B/nn_bench" --model resnet18 --image 32 --channels 3 --batch $b --device cuda --math $m --layout $layout --iters 40 --graph 1 2>/dev/null | tail -1
      timeout 120 python3 bench/torch_reference.py --model resnet18 --image 32 --channels 3 --batch $b --device cuda --dtype $m $flag --iters 40 2>/dev/null | tail -1
    done; done
    for g in 0 1; do
      timeout 200 "$B/nn_bench" --model resnet50 --stem imagenet --image 224 --channels 3 --batch 128 --device cuda --math bf16 --layout cl --iters 15 --graph $g 2>/dev/null | tail -1
    done
    timeout 200 python3 bench/torch_reference.py --model resnet50 --stem imagenet --image 224 --channels 3 --batch 128 --device cuda --dtype bf16 --channels-last --iters 15 2>/dev/null | tail -1
  } | tee "$OUT/throughput.txt"
fi

if want fmnist; then
  for p in fp32 bf16 fp16; do
    echo "== configs/fashion_mnist_resnet18.toml, $p"
    timeout 300 "$B/trainer" train configs/fashion_mnist_resnet18.toml --set train.device=cuda --set train.precision=$p \
      --set data.root="$FM" --set train.run_dir=/tmp/fm18_$p > "$OUT/fm18_$p.log" 2>&1
    grep -E "^done|rror" "$OUT/fm18_$p.log" | tail -2
  done
fi

if want bench; then
  echo "== trainer bench, real loader, 1 GPU"
  timeout 300 "$B/trainer" bench configs/cifar10_resnet18.toml --procs 1 --batch 128,512 --precisions fp32,bf16 \
    --steps 30 --warmup 5 --out /tmp/bench 2>&1 | tail -8 | tee "$OUT/bench.txt"
  cp /tmp/bench/bench.csv /tmp/bench/bench.json "$OUT/" 2>/dev/null
fi

if want plan; then
  echo "== trainer plan (dry run on the GPU) vs measured peak (nn_bench)"
  {
    for b in 128 512; do
      "$B/trainer" plan configs/cifar10_resnet18.toml --procs 1 --set train.device=cuda --set train.precision=bf16 --set data.batch_size=$b 2>&1 | grep -E "^DP"
      "$B/nn_bench" --model resnet18 --image 32 --channels 3 --batch $b --device cuda --math bf16 --layout cl --iters 5 2>/dev/null | tail -1
    done
  } | tee "$OUT/plan.txt"
fi

if want resume; then
  echo "== bit-exact resume on the GPU (train.deterministic): 60 steps vs 30 + SIGTERM + resume + 30"
  C="configs/fashion_mnist_cnn.toml --set train.device=cuda --set train.deterministic=true --set data.root=$FM --set train.max_steps=60 --set checkpoint.every_steps=10"
  rm -rf /tmp/ra /tmp/rb
  timeout 120 "$B/trainer" train $C --set train.run_dir=/tmp/ra > /tmp/ra.log 2>&1
  TRAINER_TEST_SIGTERM_AT_STEP=30 timeout 120 "$B/trainer" train $C --set train.run_dir=/tmp/rb > /tmp/rb.log 2>&1
  timeout 120 "$B/trainer" train $C --set train.run_dir=/tmp/rb --resume auto > /tmp/rb2.log 2>&1
  {
    cmp /tmp/ra/train_steps.csv /tmp/rb/train_steps.csv && echo "loss sequence identical"
    cmp /tmp/ra/checkpoints/final.safetensors /tmp/rb/checkpoints/final.safetensors && echo "final weights identical"
  } | tee "$OUT/resume.txt"
fi

if want trace; then
  echo "== kernel profiles, ours (CUPTI) and PyTorch (torch.profiler), bf16 channels-last"
  {
    for args in "--model resnet18 --image 32 --batch 512" "--model resnet50 --stem imagenet --image 224 --batch 128"; do
      echo "-- ours $args"
      timeout 120 "$B/nn_bench" --device cuda --channels 3 --math bf16 --layout cl --iters 10 --trace 3 $args 2>&1 | grep -A25 '^trace over' | cut -c1-150
      echo "-- torch $args"
      timeout 150 python3 bench/torch_profile.py --dtype bf16 --channels-last --steps 3 --top 25 $args 2>/dev/null | cut -c1-150
    done
  } > "$OUT/trace.txt"
  head -3 "$OUT/trace.txt"
fi
