#!/usr/bin/env bash
# Every tracked file of a top-level folder is listed in that folder's README.md (by its name, its
# path below the folder, or its stem as `stem.*`), so that a newcomer can find what a file is for without opening it. Run by
# ctest (folder_readmes); prints each file a README misses.
set -euo pipefail
cd "$(dirname "$0")/.."
folders=(app nn data dist metrics bench scripts configs docs cmake tests)
missing=0
for folder in "${folders[@]}"; do
  readme="$folder/README.md"
  if [[ ! -f $readme ]]; then
    echo "$readme: missing"
    missing=$((missing + 1))
    continue
  fi
  # Tracked files when this is a git checkout (CI clones one), else every file; results and golden
  # data are listed by their folder, not one by one.
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    files=$(git ls-files "$folder")
  else
    files=$(find "$folder" -type f)
  fi
  while IFS= read -r path; do
    [[ -z $path || $path == */README.md || $path == "$readme" ]] && continue
    case $path in bench/results/* | tests/nn/golden/* | configs/grafana/*.json) continue ;; esac
    name=$(basename "$path")
    stem=${name%.*}
    relative=${path#"$folder"/}
    if ! grep -qF -e "\`$name\`" -e "\`$relative\`" -e "\`$stem.*\`" "$readme"; then
      echo "$readme: does not list $path"
      missing=$((missing + 1))
    fi
  done <<<"$files"
done
if ((missing > 0)); then
  echo "$missing file(s) missing from their folder's README.md"
  exit 1
fi
echo "every file is listed in its folder's README.md"
