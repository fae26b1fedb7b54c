#!/usr/bin/env bash
# Data-parallel benchmark: gpt2-124m (T=256, global batch 4) on 1 rank x N threads against N ranks x
# 1 thread for every ZeRO stage (and stages 1 and 3 with offload): tokens/s, the tracker's
# per-rank memory by category (what the model predicts from the tensor table) and the measured
# process peak RSS. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset, as for every benchmark.
set -euo pipefail
usage() {
  echo "usage: bench/run_dp_bench.sh [--ranks N] [--steps S]   (defaults: 2 ranks, 4 steps)"
}
ranks=2
steps=4
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_dp_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
common=(configs/gpt2-124m.yaml --set "train.steps=$steps" --set data.val_path= --set log.every=1000
        --set "log.dir=$(mktemp -d)")
run() {  # label, then the command
  local label="$1"; shift
  local out
  out=$("$@" 2>&1) || { echo "$out" >&2; exit 1; }
  local tps mem rss
  tps=$(echo "$out" | sed -n 's/^throughput \([0-9.]*\) tokens.*/\1/p')
  mem=$(echo "$out" | sed -n 's/^memory (per rank): //p' | head -1)
  rss=$(echo "$out" | sed -n 's/.*process peak RSS \(.*\)$/\1/p')
  printf '%-26s %9s   %-10s  %s\n' "$label" "$tps" "$rss" "$mem"
}
printf '%-26s %9s   %-10s  %s\n' layout tokens/s "peak RSS" "tracked memory per rank (model prediction)"
run "1 rank x $ranks threads" peer \
  COLOSSAL_HOST_THREADS="$ranks" "$train" "${common[@]}"
micro=$((4 / ranks))
for stage in 0 1 2 3; do
  run "$ranks ranks x 1, ZeRO $stage" peer \
    mpirun -np "$ranks" --oversubscribe "$train" "${common[@]}" --set "parallel.data=$ranks" \
    --set "train.micro_batch=$micro" --set "parallel.zero.stage=$stage"
done
run "$ranks ranks x 1, ZeRO 1+offload" peer \
  mpirun -np "$ranks" --oversubscribe "$train" "${common[@]}" --set "parallel.data=$ranks" \
  --set "train.micro_batch=$micro" --set parallel.zero.stage=1 \
  --set parallel.zero.offload.optimizer=true
run "$ranks ranks x 1, ZeRO 3+offload" peer \
  mpirun -np "$ranks" --oversubscribe "$train" "${common[@]}" --set "parallel.data=$ranks" \
  --set "train.micro_batch=$micro" --set parallel.zero.stage=3 \
  --set parallel.zero.offload.optimizer=true --set parallel.zero.offload.params=true
