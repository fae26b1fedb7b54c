#!/usr/bin/env bash
# parallel.mode: auto against a grid of manual layouts on this machine: for a small GPT-2 at 2, 4
# and 8 ranks, the measured step time (colossal_train --profile-steps N, mean after the first) of
# the auto plan next to every manual layout of the grid (data, tensor, sequence, pipeline, with
# ZeRO 0 and 2), with a calibrated hardware file. Oversubscribed rank counts (more ranks than
# cores) are for the record, not for speed claims. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are
# unset, as for every benchmark. The fastest of many noisy single runs is biased low, so the auto
# plan and the grid's fastest layout are then measured again, alternately, --repeat times, and
# their medians compared.
set -euo pipefail
usage() {
  echo "usage: bench/run_auto_plan_bench.sh [--steps N] [--ranks \"2 4 8\"] [--repeat N]"
}
steps=3
ranks="2 4 8"
repeat=5
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift ;;
    --ranks) ranks="$2"; shift ;;
    --repeat) repeat="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_auto_plan_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$repeat" in ''|*[!0-9]*|0) echo "run_auto_plan_bench.sh: --repeat must be 1 or more" >&2; exit 2 ;; esac
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
calibrate "$work/hw.yaml"
model=(configs/quickstart.yaml --set model.layers=4 --set model.hidden=256 --set model.heads=8
       --set train.seq_len=128 --set train.global_batch=16 --set data.val_path= --set sample.tokens=0
       --set "hardware.file=$work/hw.yaml" --set "log.dir=$work/run")

measure() {  # ranks, extra args -> mean step seconds
  local n="$1"; shift
  local out
  out=$(peer mpirun -np "$n" --oversubscribe "$train" "${model[@]}" "$@" --profile-steps "$steps" 2>&1) ||
    { echo "failed"; return 0; }
  echo "$out" | sed -n 's/.*predicted, \([0-9.]*\) s measured.*/\1/p' | head -1
}

for n in $ranks; do
  echo
  echo "== $n ranks =="
  auto=$(measure "$n" --set parallel.mode=auto)
  printf '%-44s %9s s\n' "auto" "$auto"
  best=""; best_label=""; best_args=""
  for t in 1 2 4; do for p in 1 2 4; do for s in 1 2; do
    [ $((t * p * s)) -le "$n" ] || continue
    [ $((n % (t * p * s))) -eq 0 ] || continue
    d=$((n / (t * p * s)))
    [ $((16 % d)) -eq 0 ] || continue
    micro=$((16 / d)); [ "$micro" -gt 4 ] && micro=4
    for z in 0 2; do
      [ "$z" -gt 0 ] && [ $((d * s)) -eq 1 ] && continue
      label="data $d tensor $t sequence $s pipeline $p zero $z"
      args="--set parallel.data=$d --set parallel.tensor.size=$t --set parallel.sequence=$s \
--set parallel.pipeline.size=$p --set parallel.zero.stage=$z --set train.micro_batch=$micro"
      # shellcheck disable=SC2086
      sec=$(measure "$n" $args)
      printf '%-44s %9s s\n' "$label" "$sec"
      if [ -n "$sec" ] && [ "$sec" != failed ] &&
         { [ -z "$best" ] || awk -v a="$sec" -v b="$best" 'BEGIN{exit !(a < b)}'; }; then
        best="$sec"; best_label="$label"; best_args="$args"
      fi
    done
  done; done; done
  if [ -z "$best_args" ]; then echo "no layout of the grid ran at $n ranks"; continue; fi
  awk -v a="$auto" -v b="$best" 'BEGIN{printf "one run each: auto %.4f s against the fastest of the grid %.4f s: %+.1f%%\n", a, b, 100*(a/b-1)}'
  autos=(); bests=()
  for _ in $(seq "$repeat"); do
    autos+=("$(measure "$n" --set parallel.mode=auto)")
    # shellcheck disable=SC2086
    bests+=("$(measure "$n" $best_args)")
  done
  median() {  # of the runs that gave a time
    printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g |
      awk '{v[NR]=$1} END{if (NR == 0) print "nan"; else print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'
  }
  a=$(median "${autos[@]}"); b=$(median "${bests[@]}")
  echo "again, alternately, $repeat times: auto ${autos[*]}; $best_label ${bests[*]}"
  awk -v a="$a" -v b="$b" 'BEGIN{printf "median of %s: auto %.4f s against %.4f s: %+.1f%%\n", "'"$repeat"'", a, b, 100*(a/b-1)}'
done
