#!/usr/bin/env bash
# `trainer predict` against `trainer eval` on Fashion-MNIST test images written as PNGs, with two bad
# files among them (scripts/predict_check.py). Run by ctest (predict_fashion_mnist); exits 77 (skipped)
# without the dataset (apt-get install dataset-fashion-mnist) or the binary. Trains the cnn for 60
# steps first (about 40 s on 2 cores): predictions of a trained model are far from ties.
#   scripts/predict_check.sh BUILD_DIR
set -euo pipefail
build=${1:?BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
[[ -x $build/trainer ]] || { echo "predict_fashion_mnist: $build/trainer not built: skipped"; exit 77; }
[[ -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ]] ||
  { echo "predict_fashion_mnist: Fashion-MNIST not installed (dataset-fashion-mnist): skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
config=$here/../configs/fashion_mnist_cnn.toml
"$build/trainer" train "$config" --set train.max_steps=60 --set train.epochs=1 --set train.device=cpu \
  --set "train.run_dir=$work/run" --set metrics.port=0 >"$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
python3 "$here/predict_check.py" "$build/trainer" "$config" "$work/run/checkpoints/final.safetensors" "$work"
