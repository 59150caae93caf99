#!/usr/bin/env bash
# Every shell script of the repository parses (bash -n), and each one with a #! line is executable (the
# others, such as torch_python.sh, are sourced). Most of bench/'s scripts only
# run on a GPU host, whose time is scarce and lent a call at a time: a script that fails to parse there
# costs a whole device call, so it is caught here instead. Run by ctest (shell_scripts_parse).
set -euo pipefail
cd "$(dirname "$0")/.."
bad=0
for f in .ci/run bench/*.sh scripts/*.sh; do
  [[ -f $f ]] || continue
  if ! bash -n "$f"; then
    echo "$f: does not parse"
    bad=$((bad + 1))
  fi
  if [[ $(head -c 2 "$f") == '#!' && ! -x $f ]]; then
    echo "$f: not executable (chmod +x)"
    bad=$((bad + 1))
  fi
done
echo "shell scripts: $bad problem(s)"
exit $((bad > 0))
