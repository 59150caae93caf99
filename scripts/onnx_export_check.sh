#!/usr/bin/env bash
# Exports every shipped model family and runs it in ONNX Runtime against `trainer eval --dump-logits`
# (scripts/onnx_export_check.py says what is compared). Run by ctest (onnx_export); exits 77, which
# ctest reports as skipped, where trainer was built without ONNX (libonnx-dev, libprotobuf-dev), or
# node or npm's onnxruntime-node is missing and cannot be installed (offline).
# onnxruntime-node is looked for in $TRAINER_ONNXRUNTIME_NODE_MODULES, then BUILD_DIR/onnxruntime-node,
# where it is installed with npm when missing (--ignore-scripts: the package's install script only
# downloads the CUDA provider from NuGet; the CPU runtime is in the npm tarball).
#   scripts/onnx_export_check.sh BUILD_DIR [FAMILY ...]
set -euo pipefail
build=${1:?BUILD_DIR}
shift
here=$(cd "$(dirname "$0")" && pwd)
ort_version=1.31.1
skip() { echo "onnx_export: $*: skipped"; exit 77; }

[[ -x $build/trainer ]] || skip "$build/trainer not built"
rc=0
"$build/trainer" export --help >/dev/null 2>&1 || rc=$?
[[ $rc -ne 3 ]] || skip "trainer export is not built in (apt-get install libonnx-dev libprotobuf-dev, reconfigure)"
command -v node >/dev/null || skip "node not found"
modules=${TRAINER_ONNXRUNTIME_NODE_MODULES:-$build/onnxruntime-node/node_modules}
has_ort() { NODE_PATH=$modules node -e "require('onnxruntime-node')" >/dev/null 2>&1; }
if ! has_ort && [[ -z ${TRAINER_ONNXRUNTIME_NODE_MODULES:-} ]]; then
  command -v npm >/dev/null || skip "onnxruntime-node not in $modules and npm not found"
  echo "onnx_export: installing onnxruntime-node@$ort_version into $build/onnxruntime-node"
  timeout 300 npm install --prefix "$build/onnxruntime-node" --no-audit --no-fund --ignore-scripts \
    "onnxruntime-node@$ort_version" >"$build/onnxruntime-node.log" 2>&1 ||
    skip "npm could not install onnxruntime-node (offline?), see $build/onnxruntime-node.log"
fi
has_ort || skip "onnxruntime-node does not load from $modules"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$here/onnx_export_check.py" "$build/trainer" "$modules" "$work" "$@"
