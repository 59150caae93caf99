#!/usr/bin/env bash
# data/augment/ against torchvision.transforms.functional (scripts/torchvision_augment_parity.py) for
# ctest (torchvision_augment_parity); exits 77, which ctest reports as skipped, without torchvision
# (Debian's python3-torchvision) or before build/augment_parity_dump was built.
#   scripts/torchvision_augment_parity.sh BUILD_DIR
set -euo pipefail
build=${1:?BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
torch_modules="torch torchvision"
source "$here/torch_python.sh"
if [[ ! -x $build/augment_parity_dump ]]; then
  echo "torchvision_augment_parity: $build/augment_parity_dump not built" \
       "(cmake --build $build --target augment_parity_dump): skipped"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$build/augment_parity_dump" "$out"
"$torch_python" "$here/torchvision_augment_parity.py" "$out"
