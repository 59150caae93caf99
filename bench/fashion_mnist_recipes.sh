#!/usr/bin/env bash
# Issues 38 and 39's accuracy tables in one run on a GPU host: each Fashion-MNIST config trained by the
# trainer and by its PyTorch twin (bench/torch_fashion_mnist_recipe.py, the same recipe read from the same
# TOML) for each seed; prints config, seed, final test top-1 and training seconds (evaluation excluded)
# of each, the EMA's top-1 where the config averages weights, and per config the means and the gap.
# Usage, from the repository root:
#   bench/fashion_mnist_recipes.sh BIN_DIR FM_DIR OUT_DIR [CONFIG.toml ...] [SEEDS]
# CONFIGs default to configs/fashion_mnist_resnet18.toml, configs/fashion_mnist_vit.toml and, when it
# exists, configs/fashion_mnist_resnet18_recipe.toml; SEEDS (one argument, "0 1 2" or "0,1,2") to 0 1 2.
# Environment: DEVICE (cuda), PYTHON (python3), TORCH_ARGS (e.g. "--compile --workers 16"), SETS (more
# "section.key=value" for both sides, e.g. "train.max_steps=5" for a dry run), TIMEOUT (seconds, 3600).
# Writes each run's log and summary to OUT_DIR and the table to OUT_DIR/recipes.txt.
set -u
B=${1:?BIN_DIR}; FM=${2:?FM_DIR}; OUT=${3:?OUT_DIR}; shift 3
PYTHON=${PYTHON:-python3}; DEVICE=${DEVICE:-cuda}; TIMEOUT=${TIMEOUT:-3600}
configs=(); seeds="0 1 2"
for arg in "$@"; do
  if [[ $arg == *.toml ]]; then configs+=("$arg"); else seeds=${arg//,/ }; fi
done
if [ ${#configs[@]} -eq 0 ]; then
  configs=(configs/fashion_mnist_resnet18.toml configs/fashion_mnist_vit.toml)
  [ -f configs/fashion_mnist_resnet18_recipe.toml ] && configs+=(configs/fashion_mnist_resnet18_recipe.toml)
fi
mkdir -p "$OUT"
sets=(); for s in ${SETS:-}; do sets+=(--set "$s"); done

# One summary.json as "top1 seconds ema_top1" (percent, seconds; "-" where a value is missing).
summary_cells() {
  python3 - "$1" <<'EOF'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print("- - -"); sys.exit()
cell = lambda key, scale, form: form % (scale * s[key]) if s.get(key) is not None else "-"
print(cell("final_test_accuracy", 100, "%.2f"), cell("train_seconds", 1, "%.1f"),
      cell("final_ema_test_accuracy", 100, "%.2f"))
EOF
}

rows="$OUT/recipes.tsv"; : > "$rows"
for cfg in "${configs[@]}"; do
  stem=$(basename "$cfg" .toml)
  for seed in $seeds; do
    run="$OUT/${stem}_seed$seed"
    rm -rf "$run"
    timeout "$TIMEOUT" "$B/trainer" train "$cfg" --set train.device="$DEVICE" --set train.seed="$seed" \
      --set data.root="$FM" --set train.run_dir="$run" "${sets[@]}" > "$run.log" 2>&1 \
      || echo "trainer: $cfg seed $seed failed (exit $?), see $run.log" >&2
    timeout "$TIMEOUT" "$PYTHON" bench/torch_fashion_mnist_recipe.py "$cfg" --data-root "$FM" \
      --set train.device="$DEVICE" --set train.seed="$seed" "${sets[@]}" --summary "$run.torch.json" \
      ${TORCH_ARGS:-} > "$run.torch.log" 2>&1 \
      || echo "pytorch: $cfg seed $seed failed (exit $?), see $run.torch.log" >&2
    echo "$stem $seed $(summary_cells "$run/summary.json") $(summary_cells "$run.torch.json")" >> "$rows"
  done
done

# The table, then per config the means over the seeds that finished and PyTorch's gap and time ratio.
awk -v torch_args="${TORCH_ARGS:-}" '
  BEGIN { printf "%-34s %4s | %8s %8s %8s | %8s %8s %8s\n", "config", "seed", "top1 %", "train s",
                 "EMA %", "torch %", "torch s", "t. EMA %" }
  { printf "%-34s %4s | %8s %8s %8s | %8s %8s %8s\n", $1, $2, $3, $4, $5, $6, $7, $8
    if (!($1 in n)) order[++configs] = $1
    n[$1]++
    for (i = 3; i <= 8; i++) if ($i != "-") { sum[$1, i] += $i; cnt[$1, i]++ } }
  END {
    print "\nmeans over seeds (pytorch " (torch_args == "" ? "eager" : torch_args) ")"
    for (k = 1; k <= configs; k++) {
      c = order[k]
      for (i = 3; i <= 8; i++) mean[i] = cnt[c, i] ? sprintf("%.2f", sum[c, i] / cnt[c, i]) : "-"
      gap = (mean[3] != "-" && mean[6] != "-") ? sprintf("%+.2f", mean[6] - mean[3]) : "-"
      ratio = (mean[4] != "-" && mean[7] != "-" && mean[4] + 0 > 0) ? sprintf("%.2fx", mean[7] / mean[4]) : "-"
      printf "%-34s %4s | %8s %8s %8s | %8s %8s %8s | torch - ours %s points, torch time %s ours\n",
             c, n[c], mean[3], mean[4], mean[5], mean[6], mean[7], mean[8], gap, ratio
    }
  }' "$rows" | tee "$OUT/recipes.txt"
