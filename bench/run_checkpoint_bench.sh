#!/usr/bin/env bash
# Memory against time for activation checkpointing: gpt2-124m at T=1024, micro-batch 1, one rank.
# Runs none, full and sqrt, then rotor under budgets from the least memory any schedule needs up to
# keeping everything, each with colossal_train --profile-steps N (tracked peak memory and the mean
# step time after the first), and reports the memory rotor saves at 10% and 30% slowdown against
# `none` (total per rank, and of activations + temporaries, where the recompute arena lives). OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are
# unset, as for every benchmark.
set -euo pipefail
usage() {
  echo "usage: bench/run_checkpoint_bench.sh [--steps N] [--seq T] [--points K]"
  echo "  defaults: 2 profiled steps, T=1024, 6 rotor budgets"
}
steps=2
seq=1024
points=6
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift ;;
    --seq) seq="$2"; shift ;;
    --points) points="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_checkpoint_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
calibrate "$work/hw.yaml"
base=(configs/gpt2-124m.yaml --set "train.seq_len=$seq" --set train.global_batch=1
      --set train.micro_batch=1 --set data.val_path= --set sample.tokens=0
      --set "hardware.file=$work/hw.yaml" --set "log.dir=$work/run")

bytes() {  # "1.23 GiB" -> bytes
  echo "$1" | awk '{u=$2; v=$1; m=(u=="KiB")?1024:(u=="MiB")?1048576:(u=="GiB")?1073741824:1; printf "%.0f", v*m}'
}
measure() {  # label, extra args: prints "label seconds bytes activations-bytes schedule"
  local label="$1"; shift
  local out line sched
  out=$(peer "$train" "${base[@]}" "$@" --profile-steps "$steps" 2>&1) || { echo "$out" >&2; exit 1; }
  line=$(echo "$out" | grep '^cost model (rank 0, hardware')
  sched=$(echo "$out" | sed -n 's/^activation checkpointing: //p')
  local s mem act
  s=$(echo "$line" | sed -n 's/.*predicted, \([0-9.]*\) s measured.*/\1/p')
  mem=$(bytes "$(echo "$line" | sed -n 's/.* predicted, \(.*\) tracked$/\1/p')")
  # Activations plus temporaries (the recompute arena is a temporary).
  local a t
  a=$(bytes "$(echo "$out" | sed -n 's/^memory (per rank): .*activations \([0-9.]* [KMG]iB\).*/\1/p')")
  t=$(bytes "$(echo "$out" | sed -n 's/^memory (per rank): .*temporaries \([0-9.]* [KMG]iB\).*/\1/p')")
  act=$((a + t))
  echo "$label $s $mem $act ${sched:-none}"
}

rows="$work/rows"
: > "$rows"
measure none --set checkpointing.policy=none >> "$rows"
measure full --set checkpointing.policy=full >> "$rows"
measure sqrt --set checkpointing.policy=sqrt >> "$rows"
none_mem=$(awk '$1=="none"{print $3}' "$rows")
# The least memory any schedule needs: what rotor's error names for a budget of 1 MiB.
min_text=$("$plan" "${base[@]}" --profile --set checkpointing.policy=rotor \
  --set checkpointing.memory_budget=0.001 2>&1 | sed -n 's/.*is below the \([0-9.]* [KMG]iB\) that.*/\1/p' || true)
min_mem=$(bytes "$min_text")
for i in $(seq 0 $((points - 1))); do
  budget=$(awk -v lo="$min_mem" -v hi="$none_mem" -v i="$i" -v k="$points" \
    'BEGIN{lo *= 1.02; printf "%.6f", (lo + (hi - lo) * i / (k - 1)) / 1073741824}')
  measure "rotor@${budget}GiB" --set checkpointing.policy=rotor \
    --set "checkpointing.memory_budget=$budget" >> "$rows"
done

printf '\n%-22s %10s %12s %12s %9s  %s\n' policy "step s" "peak" "acts+temps" "slowdown" schedule
awk -v none_s="$(awk '$1=="none"{print $2}' "$rows")" '{
  sched = $0; for (i = 1; i <= 4; ++i) sub(/^[^ ]+ /, "", sched)
  printf "%-22s %10.3f %9.1f MiB %9.1f MiB %+8.1f%%  %s\n", $1, $2, $3/1048576, $4/1048576,
         100*($2/none_s-1), sched }' "$rows"
awk -v none_s="$(awk '$1=="none"{print $2}' "$rows")" -v none_m="$none_mem" \
    -v none_a="$(awk '$1=="none"{print $4}' "$rows")" '
  $1 ~ /^rotor/ { for (k = 0; k < 2; ++k) { lim = k ? 1.3 : 1.1;
      if ($2 <= lim * none_s && (best[k] == "" || $3 < best[k])) { best[k] = $3; act[k] = $4 } } }
  END { for (k = 0; k < 2; ++k) {
      if (best[k] == "") { printf "rotor within %d%% slowdown: no point\n", k ? 30 : 10; continue }
      printf "rotor within %d%% slowdown: %.1f%% of the memory per rank saved (%.1f%% of activations + temporaries)\n",
             k ? 30 : 10, 100 * (1 - best[k] / none_m), 100 * (1 - act[k] / none_a) } }' "$rows"
