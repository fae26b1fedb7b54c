#!/usr/bin/env bash
# The longest sequence that trains gpt2-124m (micro-batch 1) in a memory limit (default 8 GiB),
# for colossal's dense attention, its tiled fused attention, and fused attention with full
# activation checkpointing, against the PyTorch peer (bench/pytorch_peer.py: Debian's PyTorch
# 1.13, whose attention stores the T x T probabilities). colossal's sizes come from
# `colossal_train --memory-plan` (allocates nothing; equal to the tracker's peak byte for byte),
# searched in steps of 512 positions, and the longest fused one is then trained for one step to
# show it runs, with its peak RSS. PyTorch is run for one step at each length until its peak RSS
# passes the limit. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset for both.
set -euo pipefail
usage() {
  echo "usage: bench/run_long_seq_bench.sh [--limit-gib G] [--no-peer] [--no-run]"
  echo "  --limit-gib G  memory limit (default 8)"
  echo "  --no-peer      skip PyTorch;  --no-run  skip the confirming training step"
}
limit_gib=8
with_peer=1
with_run=1
while [ $# -gt 0 ]; do
  case "$1" in
    --limit-gib) limit_gib="$2"; shift ;;
    --no-peer) with_peer=0 ;;
    --no-run) with_run=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_long_seq_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
limit=$(awk -v g="$limit_gib" 'BEGIN{printf "%.0f", g*1073741824}')
base=(configs/gpt2-124m.yaml --set train.global_batch=1 --set train.micro_batch=1
      --set data.val_path= --set sample.tokens=0 --set "log.dir=$work/run")

planned_bytes() {  # T, extra args -> bytes the largest rank needs
  local T="$1"; shift
  peer "$train" "${base[@]}" --set "train.seq_len=$T" --set "model.max_seq=$T" "$@" --memory-plan \
    2>&1 | sed -n 's/^memory plan: largest rank needs .*(\([0-9]*\) bytes)$/\1/p'
}
longest() {  # extra args -> the longest T (multiple of 512) under the limit
  local T=512 best=0 bytes
  while :; do
    bytes=$(planned_bytes "$T" "$@")
    [ -n "$bytes" ] && [ "$bytes" -le "$limit" ] || break
    best=$T
    T=$((T + 512))
    [ "$T" -le 65536 ] || break
  done
  echo "$best"
}
gib() { awk -v b="$1" 'BEGIN{printf "%.2f GiB", b/1073741824}'; }

declare -A result
for variant in dense fused fused+full; do
  case "$variant" in
    dense) extra=(--set model.fused_attention=false) ;;
    fused) extra=(--set model.fused_attention=true) ;;
    fused+full) extra=(--set model.fused_attention=true --set checkpointing.policy=full) ;;
  esac
  T=$(longest "${extra[@]}")
  result[$variant]="$T $(gib "$(planned_bytes "$T" "${extra[@]}")")"
  echo "colossal $variant: longest T = ${result[$variant]}"
done

run_line="not run"
if [ "$with_run" = 1 ]; then
  T=${result[fused]%% *}
  echo "training one step of gpt2-124m at T=$T with fused attention ..."
  out=$(peer /usr/bin/time -f 'MAXRSS_KB=%M' "$train" "${base[@]}" --set "train.seq_len=$T" \
        --set "model.max_seq=$T" --set model.fused_attention=true --set train.steps=1 2>&1) ||
    { echo "$out" >&2; exit 1; }
  rss=$(echo "$out" | sed -n 's/^MAXRSS_KB=//p')
  loss=$(echo "$out" | sed -n 's/^step *1\/1 | loss \([0-9.]*\).*/\1/p')
  run_line="T=$T trained: loss $loss, peak RSS $(awk -v k="$rss" 'BEGIN{printf "%.2f GiB", k/1048576}')"
  echo "$run_line"
fi

peer_T=0
peer_rss=""
if [ "$with_peer" = 1 ]; then
  for T in 512 1024 1536 2048 2560 3072 3584 4096 5120 6144; do
    line=$("$root/bench/run_pytorch_peer.sh" --preset gpt2-124m --seq-len "$T" --max-positions "$T" \
           --batch 1 --threads 2 --steps 1 --warmup-steps 0 2>/dev/null | grep '^RESULT' || true)
    mib=$(echo "$line" | sed -n 's/.*peak_rss_mib=\([0-9.]*\).*/\1/p')
    echo "pytorch T=$T: peak RSS ${mib:-failed} MiB"
    [ -n "$mib" ] || break
    awk -v m="$mib" -v l="$limit" 'BEGIN{exit !(m*1048576 <= l)}' || break
    peer_T=$T
    peer_rss="$mib MiB"
  done
fi

echo
printf '%-28s %8s %s\n' "gpt2-124m, B=1, limit ${limit_gib} GiB" "longest T" "memory at that T"
for variant in dense fused fused+full; do
  printf '%-28s %8s %s (planned = tracked)\n' "colossal $variant" "${result[$variant]%% *}" \
    "${result[$variant]#* }"
done
[ "$with_peer" = 1 ] && printf '%-28s %8s %s (peak RSS)\n' "pytorch 1.13 (dense)" "$peer_T" "$peer_rss"
echo "$run_line"
