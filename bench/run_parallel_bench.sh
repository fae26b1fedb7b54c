#!/usr/bin/env bash
# Model-parallel benchmark for gpt2-124m on 2 ranks (T=256, global batch 4): tokens/s, process peak
# RSS and tracked memory per rank under dp2, tp2, tp2 with sequence_split and sp2 (ring
# self-attention); then the longest sequence whose per-rank memory fits a cap under sp1/sp2/sp4
# (micro-batch 1), measured with colossal_train --memory-plan (every buffer is allocated at
# start-up, so the plan is the run's tracked peak). OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are
# unset, as for every benchmark.
set -euo pipefail
usage() {
  echo "usage: bench/run_parallel_bench.sh [--steps S] [--cap-gib G] [--memory-only]"
  echo "  defaults: 4 steps per layout, an 8 GiB per-rank cap"
}
steps=4
cap_gib=8
memory_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift ;;
    --cap-gib) cap_gib="$2"; shift ;;
    --memory-only) memory_only=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_parallel_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
mpi() { peer mpirun -np "$1" --oversubscribe "${@:2}"; }

if [ "$memory_only" = 0 ]; then
  common=(configs/gpt2-124m.yaml --set "train.steps=$steps" --set data.val_path= --set log.every=1000
          --set sample.tokens=0 --set "log.dir=$(mktemp -d)")
  run() {  # label, extra --set arguments
    local label="$1"; shift
    local out tps mem rss
    out=$(mpi 2 "$train" "${common[@]}" "$@" 2>&1) || { echo "$out" >&2; exit 1; }
    tps=$(echo "$out" | sed -n 's/^throughput \([0-9.]*\) tokens.*/\1/p')
    mem=$(echo "$out" | sed -n 's/^memory (per rank): //p' | head -1)
    rss=$(echo "$out" | sed -n 's/.*process peak RSS \(.*\)$/\1/p')
    printf '%-22s %9s   %-10s  %s\n' "$label" "$tps" "$rss" "$mem"
  }
  printf '%-22s %9s   %-10s  %s\n' "2 ranks x 1 thread" tokens/s "peak RSS" "tracked memory per rank (rank 0)"
  run "dp2" --set parallel.data=2 --set train.micro_batch=2
  run "tp2" --set parallel.tensor.size=2
  run "tp2 + sequence_split" --set parallel.tensor.size=2 --set parallel.tensor.sequence_split=true
  run "sp2 (ring attention)" --set parallel.sequence=2
  echo
fi

cap=$((cap_gib * 1024 * 1024 * 1024))
# Bytes the largest rank needs at sequence length T under sequence parallelism S.
need() {
  mpi "$1" "$train" configs/gpt2-124m.yaml --set data.val_path= --set "parallel.sequence=$1" \
    --set "train.seq_len=$2" \
    --set "model.max_seq=$2" --set train.micro_batch=1 --set train.global_batch=1 --memory-plan \
    2>&1 | sed -n 's/^memory plan: largest rank needs .* (\([0-9]*\) bytes)$/\1/p'
}
printf 'longest sequence that fits %s GiB per rank (gpt2-124m, micro-batch 1, fp32)\n' "$cap_gib"
printf '%-10s %10s %14s\n' sequence "seq_len" "rank memory"
for s in 1 2 4; do
  step=$((64 * s))  # chunks stay whole
  lo=0 hi=$((131072 / step))  # in units of step
  while [ $((hi - lo)) -gt 1 ]; do
    mid=$(((lo + hi) / 2))
    bytes=$(need "$s" $((mid * step)))
    if [ -n "$bytes" ] && [ "$bytes" -le "$cap" ]; then lo=$mid; else hi=$mid; fi
  done
  best=$((lo * step))
  bytes=$(need "$s" "$best")
  printf '%-10s %10s %11.2f GiB\n' "sp$s" "$best" "$(echo "$bytes / 1073741824" | bc -l)"
done
