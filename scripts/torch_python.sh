# Sourced by the PyTorch reference checks: sets $torch_python to a Python that imports every module
# named in $torch_modules (default "torch"), or exits 77 (ctest's "skipped") naming the Debian package.
# Debian's modules live under /usr/bin/python3; a python3 earlier on PATH (pyenv, a venv) may lack
# them, so both are tried.
#   torch_modules="torch torchvision"; source scripts/torch_python.sh
torch_python=""
_torch_imports=$(echo "${torch_modules:-torch}" | sed 's/ \+/, /g')
for _p in python3 /usr/bin/python3; do
  if "$_p" -c "import ${_torch_imports}" 2>/dev/null; then torch_python=$_p; break; fi
done
if [ -z "$torch_python" ]; then
  echo "$(basename "$0"): Python modules ${_torch_imports} not found (scripts/install-deps.sh installs them): skipped"
  exit 77
fi
