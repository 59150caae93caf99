#!/usr/bin/env bash
# Our convnext_tiny against torchvision's: scripts/torchvision_convnext_reference.py writes torchvision's
# weights and logits, nn_tests' ConvNeXtTorchvision.* loads them strictly and compares the logits. Run
# by ctest (torchvision_convnext); exits 77, which ctest reports as skipped, where torch or torchvision
# is not installed (Debian's python3-torch, python3-torchvision) or nn_tests was not built.
#   scripts/torchvision_convnext_check.sh BUILD_DIR
set -euo pipefail
build=${1:?BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
if ! python3 -c 'import torch, torchvision' 2>/dev/null; then
  echo "torchvision_convnext: torch or torchvision not found (apt-get install python3-torchvision): skipped"
  exit 77
fi
if [[ ! -x $build/tests/nn_tests ]]; then
  echo "torchvision_convnext: $build/tests/nn_tests not built (cmake --build $build --target nn_tests): skipped"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 "$here/torchvision_convnext_reference.py" "$out"
# --gtest_fail_if_no_test... is not in every gtest: a skip would print "[  SKIPPED ]", so refuse that.
log=$(TRAINER_CONVNEXT_REFERENCE="$out" "$build/tests/nn_tests" --gtest_filter='ConvNeXtTorchvision.*' 2>&1) || {
  echo "$log"
  exit 1
}
echo "$log"
if grep -q '\[  SKIPPED \]' <<<"$log"; then
  echo "torchvision_convnext: the comparison was skipped"
  exit 1
fi
