#!/usr/bin/env bash
# Collects the final metrics of every run below DIR (each directory with a metrics.csv, e.g. the
# points of a sweep) into one table: DIR/summary.csv, also printed.
#   usage: slurm/summarize.sh DIR
set -euo pipefail
dir="${1:?usage: slurm/summarize.sh DIR}"
[ -d "$dir" ] || { echo "summarize.sh: '$dir' is not a directory" >&2; exit 2; }
out="$dir/summary.csv"
echo "run,point,steps,final_loss,best_val_loss,tokens_per_s" > "$out"
find "$dir" -name metrics.csv | sort | while read -r metrics; do
  run=$(dirname "$metrics")
  point=$(cat "$run/point.txt" 2> /dev/null || echo "")
  # Columns: step,loss,lr,grad_norm,tokens_per_s,mfu,step_seconds,val_loss,peak_tracked_bytes
  awk -F, -v run="${run#"$dir"/}" -v point="$point" '
    NR > 1 { steps = $1; loss = $2; tps += $5; n++;
             if ($8 != "nan" && $8 != "" && (best == "" || $8 + 0 < best + 0)) best = $8 }
    END { printf "%s,\"%s\",%s,%s,%s,%.0f\n", run, point, steps, loss, best, n ? tps / n : 0 }
  ' "$metrics" >> "$out"
done
column -s, -t < "$out" 2> /dev/null || cat "$out"
