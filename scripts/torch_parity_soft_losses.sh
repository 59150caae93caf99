#!/usr/bin/env bash
# The soft-target losses and Mixup/CutMix against PyTorch in float64 (scripts/torch_parity_soft_losses.py).
# Run by ctest (torch_parity_soft_losses); exits 77, which ctest reports as skipped, where PyTorch is
# not installed (Debian's python3-torch) or build/soft_losses_parity was not built.
#   scripts/torch_parity_soft_losses.sh BUILD_DIR
set -euo pipefail
build=${1:?BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
torch_modules="torch torchvision"  # torch_parity.py's reader imports torchvision too
source "$here/torch_python.sh"
if [[ ! -x $build/soft_losses_parity ]]; then
  echo "torch_parity_soft_losses: $build/soft_losses_parity not built" \
    "(cmake --build $build --target soft_losses_parity): skipped"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$build/soft_losses_parity" "$out"
"$torch_python" "$here/torch_parity_soft_losses.py" "$out"
