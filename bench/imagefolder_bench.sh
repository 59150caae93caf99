#!/usr/bin/env bash
# Issue 24's table in one run on a GPU host: ResNet-50 bf16 at batch 128 and 256 trained by `trainer
# bench` on a JPEG folder (--data real) and on synthetic images of its shape, next to PyTorch's
# ImageFolder + DataLoader on the same folder; the loader alone (`trainer bench-data --root`).
#   bench/imagefolder_bench.sh BIN_DIR OUT_DIR [JPEG_DIR]
# BIN_DIR holds trainer (source the bundle's env.sh first). Without JPEG_DIR, 13,000 + 500 JPEGs of
# 500x375 at quality 90 are generated in /tmp/jpegs (bench/make_jpeg_folder.py, needs PIL).
set -u
B=${1:?BIN_DIR}; OUT=${2:?OUT_DIR}; J=${3:-/tmp/jpegs}
mkdir -p "$OUT"
[ -d "$J/train" ] || python3 bench/make_jpeg_folder.py "$J" | tee "$OUT/jpegs.txt"
echo "== trainer bench, resnet50 bf16, JPEG folder (real) and synthetic; defaults otherwise"
for data in real synthetic; do
  timeout 400 "$B/trainer" bench configs/imagefolder_resnet50.toml --procs 1 --precisions bf16 --batch 128,256 \
    --steps ${STEPS:-40} --warmup ${WARMUP:-10} --data $data --set data.root="$J" --set train.device=cuda \
    --out /tmp/ifbench-$data 2>&1 | tail -5 | tee "$OUT/trainer_$data.txt"
done
echo "== PyTorch: torchvision ImageFolder + DataLoader, all cores, pinned memory"
for b in 128 256; do
  timeout 300 python3 bench/torch_imagefolder_bench.py "$J" --batch $b --steps ${STEPS:-40} --warmup ${WARMUP:-10} 2>&1 \
    | tail -1 | tee -a "$OUT/pytorch.txt"
done
