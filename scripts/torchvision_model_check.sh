#!/usr/bin/env bash
# Our vit_b_16 or convnext_tiny against torchvision's: a Python script writes torchvision's weights and
# its logits on a fixed batch, then nn_tests loads the weights strictly and compares the logits
# (VitTorchvision.* / ConvNeXtTorchvision.*). Run by ctest (torchvision_vit_b_16,
# torchvision_convnext); exits 77, which ctest reports as skipped, where PyTorch or torchvision is not
# installed or nn_tests was not built.
#   scripts/torchvision_model_check.sh BUILD_DIR vit_b_16|convnext_tiny
set -euo pipefail
build=${1:?BUILD_DIR}
model=${2:?vit_b_16 or convnext_tiny}
here=$(cd "$(dirname "$0")" && pwd)
case $model in
  vit_b_16) script=make_vit_torchvision_golden.py variable=TRAINER_VIT_GOLDEN_DIR filter='VitTorchvision.*' ;;
  convnext_tiny) script=torchvision_convnext_reference.py variable=TRAINER_CONVNEXT_REFERENCE filter='ConvNeXtTorchvision.*' ;;
  *) echo "torchvision_model_check: no check for '$model'" >&2; exit 2 ;;
esac
torch_modules="torch torchvision"
source "$here/torch_python.sh"
if [[ ! -x $build/tests/nn_tests ]]; then
  echo "torchvision_model_check: $build/tests/nn_tests not built (cmake --build $build --target nn_tests): skipped"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$torch_python" "$here/$script" "$out"
# The tests skip without their files; a skip here would mean the comparison did not run, so refuse it.
log=$(env "$variable=$out" "$build/tests/nn_tests" --gtest_filter="$filter" 2>&1) || {
  echo "$log"
  exit 1
}
echo "$log"
if grep -q '\[  SKIPPED \]' <<<"$log"; then
  echo "torchvision_model_check: the $model comparison was skipped"
  exit 1
fi
