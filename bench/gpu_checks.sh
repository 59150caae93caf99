#!/usr/bin/env bash
# Every GPU measurement the notes quote, in one run on a GPU host, each trainer figure next to the
# PyTorch figure measured in the same run. Usage, from the repository root on the GPU host:
#   bench/gpu_checks.sh BIN_DIR FASHION_MNIST_DIR OUT_DIR [sections...]
# BIN_DIR holds trainer, gpu_tests, nn_bench and parity_step (../shared/gpu/pack makes such a bundle;
# source its env.sh first). Sections (default: all but multigpu): tests parity throughput fmnist bench plan
# resume trace; multigpu needs 2 GPUs. THROUGHPUT_MATH (default "fp32 tf32 bf16 fp16") picks the
# throughput section's precisions.
# Section multigpu (not in the default list; a host with 2 or more GPUs, ~5 min at 2 and ~8 at 4,
# torchrun from PyTorch): issue 13's scaling rows at 1, 2, 4, 8 GPUs up to MG_GPUS (default: all the
# host's GPUs; trainer bench next to bench/torch_ddp_bench.py) and the no-hang guarantees (2 ranks) under real
# NCCL (a rank killed mid-epoch under trainer launch and under torchrun, a step-count mismatch, Fashion-MNIST
# under both launchers); writes multigpu.txt (the summary) and multigpu_logs.txt (log tails) to OUT_DIR.
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
  # Each line: model batch input device math layout img/s peak-MiB.
  {
    for b in 128 512; do for m in ${THROUGHPUT_MATH:-fp32 tf32 bf16 fp16}; do
      layout=nchw; flag=""
      if [[ $m == bf16 || $m == fp16 ]]; then layout=cl; flag=--channels-last; fi
      timeout 120 "$B/nn_bench" --model resnet18 --image 32 --channels 3 --batch $b --device cuda --math $m --layout $layout --iters 100 2>/dev/null | tail -1
      timeout 120 "$B/nn_bench" --model resnet18 --image 32 --channels 3 --batch $b --device cuda --math $m --layout $layout --iters 100 --graph 1 2>/dev/null | tail -1
      # PyTorch's best eager step: cuDNN's autotuner on (the script's default) and both of its SGD
      # implementations; fused SGD also keeps GradScaler from reading found-inf back every step.
      for sgd in foreach fused; do
        timeout 120 python3 bench/torch_reference.py --model resnet18 --image 32 --channels 3 --batch $b --device cuda --dtype $m $flag --iters 100 --sgd $sgd 2>/dev/null | tail -1
      done
      # torch.compile(mode="reduce-overhead") + fused SGD: PyTorch's captured step next to our --graph 1
      # row; its peak column is max_memory_reserved() since process start (compilation included).
      timeout 300 python3 bench/torch_reference.py --model resnet18 --image 32 --channels 3 --batch $b --device cuda --dtype $m $flag --iters 100 --compile 2>/dev/null | tail -1
    done; done
    # train.cudnn_fusion (BatchNorm statistics in the convolutions' epilogues where they time faster).
    for b in 128 512; do
      timeout 120 "$B/nn_bench" --model resnet18 --image 32 --channels 3 --batch $b --device cuda --math bf16 --layout cl --iters 100 --graph 1 --fusion 1 2>/dev/null | tail -1
    done
    # Without train.cudnn_batchnorm (on by default: BatchNorm's backward through cuDNN's NHWC
    # batch-norm kernels), to show what it brings: these rows lack "+cudnn-bn".
    for b in 128 512; do for m in ${THROUGHPUT_MATH:-bf16 fp16}; do
      [[ $m == bf16 || $m == fp16 ]] || continue
      timeout 120 "$B/nn_bench" --model resnet18 --image 32 --channels 3 --batch $b --device cuda --math $m --layout cl --iters 100 --graph 1 --cudnn-bn 0 2>/dev/null | tail -1
    done; done
    for g in 0 1; do
      timeout 200 "$B/nn_bench" --model resnet50 --stem imagenet --image 224 --channels 3 --batch 128 --device cuda --math bf16 --layout cl --iters 15 --graph $g 2>/dev/null | tail -1
    done
    for sgd in foreach fused; do
      timeout 200 python3 bench/torch_reference.py --model resnet50 --stem imagenet --image 224 --channels 3 --batch 128 --device cuda --dtype bf16 --channels-last --iters 15 --sgd $sgd 2>/dev/null | tail -1
    done
  } | tee "$OUT/throughput.txt"
fi

if want fmnist; then
  # Issue 28's time to accuracy: the config as shipped (bf16), seeds 0-2: mean test top-1 and the
  # seconds of training each run took.
  echo "== configs/fashion_mnist_resnet18.toml as shipped, seeds 0 1 2"
  for s in 0 1 2; do
    timeout 300 "$B/trainer" train configs/fashion_mnist_resnet18.toml --set train.device=cuda --set train.seed=$s \
      --set data.root="$FM" --set train.run_dir=/tmp/fm18_seed$s > "$OUT/fm18_seed$s.log" 2>&1
    grep -E "^done|rror" "$OUT/fm18_seed$s.log" | tail -1
  done | tee "$OUT/fm18_seeds.txt"
  awk '/final test accuracy/ {for (i = 1; i <= NF; i++) if ($i == "accuracy") {sub("%,", "", $(i + 1)); s += $(i + 1); n++}}
       END {if (n) printf "mean final test accuracy over %d seeds: %.2f%%\n", n, s / n}' "$OUT/fm18_seeds.txt"
  for p in fp32 bf16 fp16; do
    echo "== configs/fashion_mnist_resnet18.toml, $p"
    timeout 300 "$B/trainer" train configs/fashion_mnist_resnet18.toml --set train.device=cuda --set train.precision=$p \
      --set data.root="$FM" --set train.run_dir=/tmp/fm18_$p > "$OUT/fm18_$p.log" 2>&1
    grep -E "^done|rror" "$OUT/fm18_$p.log" | tail -2
  done
  echo "== configs/fashion_mnist_resnet18.toml, bf16, train.cudnn_fusion = true"
  timeout 300 "$B/trainer" train configs/fashion_mnist_resnet18.toml --set train.device=cuda --set train.precision=bf16 \
    --set train.cudnn_fusion=true --set data.root="$FM" --set train.run_dir=/tmp/fm18_bf16_fusion > "$OUT/fm18_bf16_fusion.log" 2>&1
  grep -E "^done|rror|cuDNN fusion" "$OUT/fm18_bf16_fusion.log" | tail -3
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

if want multigpu; then
  # Everything prints to stdout and multigpu.txt; the runs' own logs stay under $MG and their tails go to
  # multigpu_logs.txt. MG_CPU_DRY_RUN=1 runs the same commands on the CPU with tiny sizes (gloo, a
  # torchrun stand-in in $TORCHRUN) to check the script itself on a machine without GPUs.
  MG=/tmp/mg; rm -rf "$MG"; mkdir -p "$MG"
  TORCHRUN=${TORCHRUN:-python3 -m torch.distributed.run}
  DEV=cuda; PREC=bf16; R18="--steps 20 --warmup 5"; R50="--steps 15 --warmup 5"; DDP="--steps 20 --warmup 5"
  R18_BATCH=128,512; R50_BATCH=128; R50_SIZE=""; KILL_AFTER="step 300/"; SYN=4000000; FM_STEPS=200
  # The scaling rows' GPU counts: 1, 2, 4, 8 up to MG_GPUS (default: the GPUs nvidia-smi lists). The
  # no-hang checks use 2 ranks whatever the host has.
  MG_GPUS=${MG_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}
  ((MG_GPUS >= 2)) || MG_GPUS=2
  PROC_COUNTS=1; for n in 2 4 8; do ((n <= MG_GPUS)) && PROC_COUNTS="$PROC_COUNTS $n"; done
  PROCS=${PROC_COUNTS// /,}
  if [[ ${MG_CPU_DRY_RUN:-0} == 1 ]]; then
    DEV=cpu; PREC=fp32; R18="--steps 2 --warmup 1"; R50="--steps 1 --warmup 1"; DDP="--device cpu --steps 1 --warmup 1"
    R18_BATCH=4; R50_BATCH=2; R50_SIZE="--set data.synthetic_image_size=32 --set data.image_size=32"; KILL_AFTER="step 4/"; SYN=4000
    FM_STEPS=8
  fi
  T="$B/trainer"
  tail_log() { echo "---- $1"; tail -n "${2:-15}" "$1" | cut -c1-400; } >> "$OUT/multigpu_logs.txt"
  # The pid of training rank $2 of the run whose run_dir is $1 (its environment has RANK=$2; the
  # launcher, also a trainer process with that run_dir on its command line, has no RANK).
  rank_pid() {
    local p exe; exe=$(readlink -f "$T")
    for p in $(pgrep -f -- "train.run_dir=$1" || true); do
      [[ $(readlink -f "/proc/$p/exe" 2>/dev/null) == "$exe" ]] || continue
      tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2" && { echo "$p"; return 0; }
    done
    return 1
  }
  wait_for() {  # FILE TEXT SECONDS PID: until FILE contains TEXT (fails when PID has exited)
    local i; for ((i = 0; i < $3 * 10; i++)); do
      grep -q -- "$2" "$1" 2>/dev/null && return 0; kill -0 "$4" 2>/dev/null || return 1; sleep 0.1
    done
    return 1
  }
  {
    echo "== multigpu: gpu_tests (NCCL)"
    if [[ $DEV == cuda ]]; then
      timeout 120 "$B/gpu_tests" --gtest_brief=1 --gtest_filter='Nccl*:*Nccl*' > "$MG/gpu_tests.log" 2>&1
      grep -E "FAILED|PASSED|tests ran" "$MG/gpu_tests.log"; tail_log "$MG/gpu_tests.log" 30
    fi

    # Eager steps at every world size (train.cuda_graph=false), so the scaling rows compare like with
    # like and show the per-phase times; the dist.cuda_graph rows come at the end of the section.
    echo "== multigpu: trainer bench, synthetic data, bf16, eager steps, $PROCS GPUs (weak scaling, lr linear)"
    for sbn in false true; do
      echo "-- resnet18-cifar32, model.sync_bn=$sbn"
      timeout 240 "$T" bench configs/cifar10_resnet18.toml --procs $PROCS --batch $R18_BATCH --precisions $PREC $R18 \
        --set train.device=$DEV --set train.cuda_graph=false --set model.sync_bn=$sbn --set dist.timeout_seconds=60 --out "$MG/bench_r18_sbn_$sbn" \
        > "$MG/bench_r18_$sbn.log" 2>&1 || echo "FAILED (exit $?)"
      grep -A8 "^procs" "$MG/bench_r18_$sbn.log"; tail_log "$MG/bench_r18_$sbn.log" 10
    done
    # Synthetic data has at most 256 classes (and evaluation needs the model's classes = the data's): 256
    # here, and in the DDP reference below (1000 would add 1.5 M parameters, 6%, to the all-reduce).
    echo "-- resnet50-imagenet224 (256 classes), model.sync_bn=false"
    timeout 240 "$T" bench configs/imagefolder_resnet50.toml --procs $PROCS --batch $R50_BATCH --precisions $PREC $R50 \
      --set train.device=$DEV --set train.cuda_graph=false --set data.synthetic_classes=256 --set schedule.warmup_epochs=0 $R50_SIZE --set dist.timeout_seconds=60 \
      --out "$MG/bench_r50" > "$MG/bench_r50.log" 2>&1 || echo "FAILED (exit $?)"
    grep -A5 "^procs" "$MG/bench_r50.log"; tail_log "$MG/bench_r50.log" 8

    echo "== multigpu: PyTorch DDP reference (bench/torch_ddp_bench.py), the same points"
    for n in $PROC_COUNTS; do
      hdr=""; ((n > 1)) && hdr=--no-header
      if [[ $DEV == cuda ]]; then
        timeout 120 $TORCHRUN --standalone --nproc-per-node $n bench/torch_ddp_bench.py $DDP $hdr --model resnet18 --batch 128,512 \
          > "$MG/ddp_$n.log" 2>&1 || echo "FAILED (exit $?)"
        timeout 120 $TORCHRUN --standalone --nproc-per-node $n bench/torch_ddp_bench.py $DDP --no-header --model resnet50 --stem imagenet --image 224 --batch 128 --classes 256 \
          >> "$MG/ddp_$n.log" 2>&1 || echo "FAILED (exit $?)"
        timeout 120 $TORCHRUN --standalone --nproc-per-node $n bench/torch_ddp_bench.py $DDP --model resnet18 --batch 128,512 --sync-bn --no-header \
          >> "$MG/ddp_$n.log" 2>&1 || echo "FAILED (exit $?)"
      else
        timeout 180 $TORCHRUN --standalone --nproc-per-node $n bench/torch_ddp_bench.py $DDP --model resnet18 --image 8 --batch 4 \
          > "$MG/ddp_$n.log" 2>&1 || echo "FAILED (exit $?)"
      fi
      grep -E "^(#|torchddp| +model)" "$MG/ddp_$n.log"; tail_log "$MG/ddp_$n.log" 6
    done

    # A training run on synthetic CIFAR-shaped data, long enough to be killed mid-epoch.
    KILLRUN="configs/cifar10_resnet18.toml --set data.dataset=synthetic --set data.synthetic_samples=$SYN
      --set data.synthetic_image_size=32 --set train.device=$DEV --set train.precision=$PREC --set train.epochs=1
      --set train.log_every_steps=100 --set dist.timeout_seconds=20 --set metrics.port=0 --set checkpoint.every_steps=0"
    [[ $DEV == cpu ]] && KILLRUN="$KILLRUN --set model.name=cnn --set data.batch_size=8 --set train.log_every_steps=2"
    for how in launch torchrun; do
      echo "== multigpu: SIGKILL of rank 1 mid-epoch under $how (dist.timeout_seconds=20)"
      run="$MG/kill_$how"; log="$MG/kill_$how.log"
      if [[ $how == launch ]]; then
        timeout 120 "$T" launch --nproc-per-node 2 -- train $KILLRUN --set train.run_dir="$run" > "$log" 2>&1 &
      else
        timeout 120 $TORCHRUN --standalone --nproc-per-node 2 --no-python "$T" train $KILLRUN --set train.run_dir="$run" > "$log" 2>&1 &
      fi
      launcher=$!
      if wait_for "$log" "$KILL_AFTER" 90 $launcher && p1=$(rank_pid "$run" 1) && p0=$(rank_pid "$run" 0); then
        t_kill=$(date +%s.%N); kill -KILL "$p1"
        # Until rank 0 has exited (a zombie its parent has not reaped yet counts as exited).
        while [[ -e /proc/$p0 && $(awk '{print $3}' "/proc/$p0/stat" 2>/dev/null) != Z ]]; do sleep 0.1; done
        t_exit=$(date +%s.%N)
        wait $launcher; rc=$?
        echo "rank 1 (pid $p1) killed at '$KILL_AFTER'; rank 0 exited $(awk "BEGIN { printf \"%.1f\", $t_exit - $t_kill }") s later; $how exit status $rc"
        echo "rank 0's error: $(grep -v '^\[rank 1\]' "$log" | grep -m1 'trainer: error:' | cut -c1-700)"
        grep -m1 -E "^trainer launch: rank" "$log"
      else
        echo "FAILED: the run did not reach '$KILL_AFTER' (or its ranks were not found) within 90 s"
        kill "$launcher" 2>/dev/null; wait $launcher
      fi
      tail_log "$log" 25
    done

    echo "== multigpu: step-count mismatch (TRAINER_TEST_EPOCH_STEPS=1:1: rank 1 claims one step more)"
    log="$MG/mismatch.log"
    TRAINER_TEST_EPOCH_STEPS=1:1 timeout 120 "$T" launch --nproc-per-node 2 -- train $KILLRUN \
      --set train.run_dir="$MG/mismatch" > "$log" 2>&1
    echo "exit status $?"
    grep 'trainer: error:' "$log" | cut -c1-300 | head -3; tail_log "$log" 10

    echo "== multigpu: Fashion-MNIST resnet18 bf16, $FM_STEPS steps, 2 ranks under each launcher"
    FMRUN="configs/fashion_mnist_resnet18.toml --set data.root=$FM --set train.device=$DEV --set train.precision=$PREC
      --set train.max_steps=$FM_STEPS --set metrics.port=0"
    [[ $DEV == cpu ]] && FMRUN="$FMRUN --set model.name=cnn --set data.batch_size=8"
    timeout 150 "$T" launch --nproc-per-node 2 -- train $FMRUN --set train.run_dir="$MG/fm_launch" > "$MG/fm_launch.log" 2>&1
    echo "trainer launch: exit $?: $(grep -E '^(\[rank 0\] )?done' "$MG/fm_launch.log" | tail -1)"
    timeout 150 $TORCHRUN --standalone --nproc-per-node 2 --no-python "$T" train $FMRUN --set train.run_dir="$MG/fm_torchrun" \
      > "$MG/fm_torchrun.log" 2>&1
    echo "torchrun: exit $?: $(grep -E '^done' "$MG/fm_torchrun.log" | tail -1)"
    tail_log "$MG/fm_launch.log" 6; tail_log "$MG/fm_torchrun.log" 10

    if [[ $DEV == cuda ]]; then
      # fp16's loss scaler kept on the device at 2 ranks: the ranks agree on the found-inf flag with an
      # NCCL all-reduce. A first scale of 2^24 overflows the first steps, so skips must show up, the
      # same on both ranks, and the run must finish.
      echo "== multigpu: Fashion-MNIST resnet18 fp16 (device loss scaler), $FM_STEPS steps, 2 ranks"
      timeout 150 "$T" launch --nproc-per-node 2 -- train ${FMRUN/precision=$PREC/precision=fp16} \
        --set train.loss_scale_init=16777216 --set train.run_dir="$MG/fm_fp16" > "$MG/fm_fp16.log" 2>&1
      echo "trainer launch: exit $?: $(grep -E '^(\[rank 0\] )?done' "$MG/fm_fp16.log" | tail -1)"
      grep -m1 "loss scaling:" "$MG/fm_fp16.log"
      for r in 0 1; do
        f="$MG/fm_fp16/train.log"; [[ $r == 1 ]] && f="$MG/fm_fp16/train.rank1.log"
        echo "rank $r skipped: $(grep -o 'step [0-9]*: inf/NaN gradients' "$f" 2>/dev/null | cut -d: -f1 | tr '\n' ' ')"
      done
      tail_log "$MG/fm_fp16.log" 10

      # dist.cuda_graph: the step captured with its all-reduce at 2 ranks. Under train.deterministic the
      # graphed run's per-step losses must equal the eager run's, and the scaling row shows what the
      # capture buys when steps are launch-bound (batch 128).
      echo "== multigpu: dist.cuda_graph at 2 ranks: graphed steps = eager steps (train_steps.csv), then throughput"
      for g in true false; do
        timeout 150 "$T" launch --nproc-per-node 2 -- train $FMRUN --set train.deterministic=true \
          --set dist.cuda_graph=$g --set train.run_dir="$MG/fm_graph_$g" > "$MG/fm_graph_$g.log" 2>&1
        echo "dist.cuda_graph=$g: exit $?: $(grep -m1 -o 'CUDA graph: [^(]*' "$MG/fm_graph_$g.log") $(grep -m1 -o 'step [0-9]* captured[^;]*' "$MG/fm_graph_$g.log")"
      done
      if cmp -s "$MG/fm_graph_true/train_steps.csv" "$MG/fm_graph_false/train_steps.csv"; then
        echo "train_steps.csv identical ($(wc -l < "$MG/fm_graph_true/train_steps.csv") lines)"
      else
        echo "FAILED: train_steps.csv differs"; diff "$MG/fm_graph_true/train_steps.csv" "$MG/fm_graph_false/train_steps.csv" | head -5
      fi
      tail_log "$MG/fm_graph_true.log" 10
      timeout 240 "$T" bench configs/cifar10_resnet18.toml --procs $PROCS --batch $R18_BATCH --precisions $PREC $R18 \
        --set train.device=$DEV --set train.cuda_graph=true --set dist.cuda_graph=true --set dist.timeout_seconds=60 \
        --out "$MG/bench_r18_graph" > "$MG/bench_r18_graph.log" 2>&1 || echo "FAILED (exit $?)"
      grep -A8 "^procs" "$MG/bench_r18_graph.log"; tail_log "$MG/bench_r18_graph.log" 10
    fi
  } 2>&1 | tee "$OUT/multigpu.txt"
fi
