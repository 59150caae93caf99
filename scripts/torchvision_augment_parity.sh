#!/usr/bin/env bash
# data/augment/ against torchvision.transforms.functional (scripts/torchvision_augment_parity.py) for
# ctest (torchvision_augment_parity); exits 77, which ctest reports as skipped, without torchvision
# (Debian's python3-torchvision) or before build/augment_parity_dump was built.
#   scripts/torchvision_augment_parity.sh BUILD_DIR
set -euo pipefail
build=${1:?BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
# The first python3 that has torchvision: a virtual environment's or pyenv's first, then Debian's.
python=""
for candidate in python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import torchvision' 2>/dev/null; then
    python=$candidate
    break
  fi
done
if [[ -z $python ]]; then
  echo "torchvision_augment_parity: torchvision not found (apt-get install python3-torchvision): skipped"
  exit 77
fi
if [[ ! -x $build/augment_parity_dump ]]; then
  echo "torchvision_augment_parity: $build/augment_parity_dump not built" \
       "(cmake --build $build --target augment_parity_dump): skipped"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$build/augment_parity_dump" "$out"
"$python" "$here/torchvision_augment_parity.py" "$out"
