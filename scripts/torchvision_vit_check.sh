#!/usr/bin/env bash
# Our vit_b_16 against torchvision's: writes torchvision's weights and logits with
# make_vit_torchvision_golden.py, then runs nn_tests' VitTorchvision.* on them. Run by ctest
# (torchvision_vit_b_16); exits 77, which ctest reports as skipped, where PyTorch or torchvision is
# not installed or nn_tests was not built.
#   scripts/torchvision_vit_check.sh BUILD_DIR
set -euo pipefail
build=${1:?BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
if ! python3 -c 'import torch, torchvision' 2>/dev/null; then
  echo "torchvision_vit_b_16: PyTorch or torchvision not found (apt-get install python3-torchvision): skipped"
  exit 77
fi
if [[ ! -x $build/tests/nn_tests ]]; then
  echo "torchvision_vit_b_16: $build/tests/nn_tests not built: skipped"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 "$here/make_vit_torchvision_golden.py" "$out"
TRAINER_VIT_GOLDEN_DIR="$out" "$build/tests/nn_tests" --gtest_filter='VitTorchvision.*'
