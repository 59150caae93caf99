#!/usr/bin/env bash
# One AdamW step of a small ViT and a small ConvNeXt against PyTorch in float64 (bench/parity_step.cpp
# builds them; scripts/torch_parity.py replays them in torchvision's classes): loss, logits, every
# gradient and every tensor after the step within 1e-10. Run by ctest (torch_parity_adamw); exits 77,
# which ctest reports as skipped, where PyTorch and torchvision are not installed or parity_step was
# not built.
#   scripts/torch_parity_adamw.sh BUILD_DIR [cpu f64 | cuda f32]
set -euo pipefail
build=${1:?BUILD_DIR}
device=${2:-cpu}
dtype=${3:-f64}
here=$(cd "$(dirname "$0")" && pwd)
torch_modules="torch torchvision"
source "$here/torch_python.sh"
if [[ ! -x $build/parity_step ]]; then
  echo "torch_parity_adamw: $build/parity_step not built (cmake --build $build --target parity_step): skipped"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for model in vit convnext; do
  "$build/parity_step" "$out/$model" "$device" "$dtype" "$model"
  "$torch_python" "$here/torch_parity.py" "$out/$model" --device "$device" | tail -4 || status=1
done
exit $status
