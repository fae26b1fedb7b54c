#!/usr/bin/env bash
# Pipeline benchmark: the measured bubble fraction of GPipe, 1F1B and interleaved 1F1B (v = 2
# chunks) against the theory (p-1)/(v m + p - 1), for p = 2 stages (2 ranks x 1 thread) and
# m = 2, 4, 8 micro-batches per step, on the quickstart model (4 blocks of 256) at T=128,
# micro-batch 4; and stage 0's tracked activation memory (GPipe keeps m micro-batches, 1F1B at
# most p - stage). Bubbles come from
# colossal_train --trace (bench/pipeline_bubble.py reads them). OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE are unset, as for every benchmark. --stages 4 runs 4 ranks (oversubscribed on
# fewer than 4 cores, where the times are not meaningful).
set -euo pipefail
usage() { echo "usage: bench/run_pipeline_bench.sh [--stages P] [--steps S]   (defaults: 2, 5)"; }
stages=2
steps=5
while [ $# -gt 0 ]; do
  case "$1" in
    --stages) stages="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_pipeline_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
printf '%-11s %3s %9s %9s   %-24s %s\n' schedule m theory measured "bubble per stage" "stage 0 activations (tracked)"
for schedule in gpipe 1f1b interleaved; do
  chunks=1
  [ "$schedule" = interleaved ] && chunks=2
  for m in 2 4 8; do
    [ "$schedule" = 1f1b ] && [ "$m" -lt "$stages" ] && continue
    [ "$schedule" = interleaved ] && [ $((m % stages)) -ne 0 ] && continue
    out=$(peer mpirun -np "$stages" --oversubscribe \
      "$train" configs/quickstart.yaml --set "train.steps=$steps" --set train.micro_batch=4 \
      --set "train.global_batch=$((4 * m))" --set "parallel.pipeline.size=$stages" \
      --set "parallel.pipeline.schedule=$schedule" --set "parallel.pipeline.chunks=$chunks" \
      --set data.val_path= --set sample.tokens=0 \
      --set log.every=1000 --set "log.dir=$work/run" --trace "$work/trace" 2>&1) ||
      { echo "$out" >&2; exit 1; }
    measured=$(python3 bench/pipeline_bubble.py "$work"/trace.rank*.json)
    # Stage 0 holds the most micro-batches in flight; --memory-plan prints rank 0's memory.
    acts=$(peer mpirun -np "$stages" --oversubscribe "$train" \
      configs/quickstart.yaml --set train.micro_batch=4 --set "train.global_batch=$((4 * m))" \
      --set "parallel.pipeline.size=$stages" --set "parallel.pipeline.schedule=$schedule" \
      --set "parallel.pipeline.chunks=$chunks" --memory-plan 2>&1 | sed -n 's/^memory plan (rank 0): .*activations \([0-9.]* [KMG]iB\).*/\1/p')
    # Interleaving v chunks divides the bubble time by v: (p-1)/(v m + p - 1).
    theory=$(echo "($stages - 1) / ($chunks * $m + $stages - 1)" | bc -l)
    printf '%-11s %3s %9.3f %9s   %-24s %s\n' "$schedule" "$m" "$theory" \
      "${measured##*mean }" "${measured% mean*}" "$acts"
  done
done
