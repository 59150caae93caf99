#!/usr/bin/env bash
# The transformer ops against PyTorch in float64 (scripts/torch_parity_ops.py). Run by ctest
# (torch_parity_ops); exits 77, which ctest reports as skipped, where PyTorch is not installed
# (Debian's python3-torch) or build/ops_parity was not built.
#   scripts/torch_parity_ops.sh BUILD_DIR
set -euo pipefail
build=${1:?BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
torch_modules="torch torchvision"  # torch_parity.py's reader imports torchvision too
source "$here/torch_python.sh"
if [[ ! -x $build/ops_parity ]]; then
  echo "torch_parity_ops: $build/ops_parity not built (cmake --build $build --target ops_parity): skipped"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$build/ops_parity" "$out"
"$torch_python" "$here/torch_parity_ops.py" "$out"
