#!/usr/bin/env bash
# The full resnet18-cifar SGD step against PyTorch, in float64 (scripts/torch_parity.py says why),
# once per OpenBLAS kernel set this CPU can execute. Run by ctest (torch_parity_resnet18); exits 77,
# which ctest reports as skipped, where PyTorch and torchvision are not installed (Debian's
# python3-torch and python3-torchvision).
#   scripts/torch_parity_kernels.sh BUILD_DIR
set -euo pipefail
build=${1:?BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
torch_modules="torch torchvision"
source "$here/torch_python.sh"
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
sets=(Prescott)
has avx2 fma && sets+=(Haswell Zen)
has avx512f avx512bw avx512vl avx512dq avx512cd && sets+=(SkylakeX)
has avx512f avx512_bf16 && sets+=(Cooperlake)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for core in "${sets[@]}"; do
  echo "== OPENBLAS_CORETYPE=$core"
  OPENBLAS_CORETYPE=$core "$build/parity_step" "$out/$core" cpu f64
  "$torch_python" "$here/torch_parity.py" "$out/$core" | tail -3 || status=1
done
exit $status
