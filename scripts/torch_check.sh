#!/usr/bin/env bash
# Runs one of scripts/' Python checks under a Python that has torch and torchvision (torch_python.sh
# finds it), for ctest; exits 77, which ctest reports as skipped, where there is none.
#   scripts/torch_check.sh SCRIPT.py [ARGS...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
script=${1:?SCRIPT.py}
shift
torch_modules="torch torchvision"
source "$here/torch_python.sh"
exec "$torch_python" "$here/$script" "$@"
