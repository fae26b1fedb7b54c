#!/usr/bin/env bash
# parallel.mode: auto against a grid of manual layouts on this machine: for a small GPT-2 at 2, 4
# and 8 ranks, the measured step time (colossal_train --profile-steps N, mean after the first) of
# the auto plan next to every manual layout of the grid (data, tensor, sequence, pipeline, with
# ZeRO 0 and 2), with a calibrated hardware file. Oversubscribed rank counts (more ranks than
# cores) are for the record, not for speed claims. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are
# unset, as for every benchmark. The fastest of many noisy single runs is biased low, and one unlucky
# run can hide the best layout, so the auto plan and the grid's --top fastest layouts are then
# measured again, in turn, --repeat rounds: the table gives each one's median and spread, and the
# median over rounds of the auto plan's time over the best layout's time in the same round (paired,
# so that the host's drift between rounds cancels).
set -euo pipefail
usage() {
  echo "usage: bench/run_auto_plan_bench.sh [--steps N] [--ranks \"2 4 8\"] [--repeat N] [--top K]"
}
steps=3
ranks="2 4 8"
repeat=5
top=3
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift ;;
    --ranks) ranks="$2"; shift ;;
    --repeat) repeat="$2"; shift ;;
    --top) top="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_auto_plan_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$repeat" in ''|*[!0-9]*|0) echo "run_auto_plan_bench.sh: --repeat must be 1 or more" >&2; exit 2 ;; esac
case "$top" in ''|*[!0-9]*|0) echo "run_auto_plan_bench.sh: --top must be 1 or more" >&2; exit 2 ;; esac
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
calibrate "$work/hw.yaml"
model=(configs/quickstart.yaml --set model.layers=4 --set model.hidden=256 --set model.heads=8
       --set train.seq_len=128 --set train.global_batch=16 --set data.val_path= --set sample.tokens=0
       --set "hardware.file=$work/hw.yaml" --set "log.dir=$work/run")

measure() {  # ranks, extra args -> mean step seconds
  local n="$1"; shift
  local out rc=0
  out=$(peer mpirun -np "$n" --oversubscribe "$train" "${model[@]}" "$@" --profile-steps "$steps" 2>&1) ||
    rc=$?
  echo "$out" > "$work/last.log"
  [ "$rc" -eq 0 ] || { echo "failed"; return 0; }
  echo "$out" | sed -n 's/.*predicted, \([0-9.]*\) s measured.*/\1/p' | head -1
}
predicted() {  # of the last measured run
  sed -n 's/.*: step \([0-9.]*\) s predicted, .*/\1/p' "$work/last.log" | head -1
}

for n in $ranks; do
  echo
  echo "== $n ranks =="
  auto=$(measure "$n" --set parallel.mode=auto)
  printf '%-44s %9s %9s\n' "layout (one run each)" "measured" "predicted"
  printf '%-44s %9s %9s   %s\n' "auto" "$auto" "$(predicted)" \
    "$(sed -n 's/^best: *//p' "$work/last.log" | head -1)"
  grid=()  # "seconds|label|args" of the layouts that ran
  for t in 1 2 4; do for p in 1 2 4; do for s in 1 2; do
    [ $((t * p * s)) -le "$n" ] || continue
    [ $((n % (t * p * s))) -eq 0 ] || continue
    d=$((n / (t * p * s)))
    [ $((16 % d)) -eq 0 ] || continue
    micro=$((16 / d / p)); [ "$micro" -gt 4 ] && micro=4  # at least one micro-batch per stage
    [ "$micro" -ge 1 ] || continue
    for z in 0 2; do
      [ "$z" -gt 0 ] && [ $((d * s)) -eq 1 ] && continue
      label="data $d tensor $t sequence $s pipeline $p zero $z"
      args="--set parallel.data=$d --set parallel.tensor.size=$t --set parallel.sequence=$s \
--set parallel.pipeline.size=$p --set parallel.zero.stage=$z --set train.micro_batch=$micro"
      # shellcheck disable=SC2086
      sec=$(measure "$n" $args)
      printf '%-44s %9s %9s\n' "$label" "$sec" "$(predicted)"
      if [[ "$sec" =~ ^[0-9.]+$ ]]; then grid+=("$sec|$label|$args"); fi
    done
  done; done; done
  if [ ${#grid[@]} -eq 0 ]; then echo "no layout of the grid ran at $n ranks"; continue; fi
  mapfile -t finalists < <(printf '%s\n' "${grid[@]}" | sort -t'|' -k1,1g | head -n "$top")
  echo "again, $repeat rounds of: auto, then the grid's $top fastest"
  declare -A times=()
  ratios=()
  for _ in $(seq "$repeat"); do
    a=$(measure "$n" --set parallel.mode=auto)
    times[auto]+=" $a"
    round_best=""
    for f in "${finalists[@]}"; do
      IFS='|' read -r _ label args <<< "$f"
      # shellcheck disable=SC2086
      sec=$(measure "$n" $args)
      times[$label]+=" $sec"
      if [[ "$sec" =~ ^[0-9.]+$ ]] &&
         { [ -z "$round_best" ] || awk -v a="$sec" -v b="$round_best" 'BEGIN{exit !(a < b)}'; }; then
        round_best="$sec"
      fi
    done
    if [[ "$a" =~ ^[0-9.]+$ ]] && [ -n "$round_best" ]; then
      ratios+=("$(awk -v a="$a" -v b="$round_best" 'BEGIN{print a / b}')")
    fi
  done
  median() {  # of the arguments that are times
    printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g |
      awk '{v[NR]=$1} END{if (NR == 0) print "nan"; else print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'
  }
  spread() { printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g | sed -n '1p;$p' | paste -sd- ; }
  printf '%-44s %9s   %s\n' "layout" "median s" "min-max over $repeat rounds"
  for key in auto "${finalists[@]}"; do
    [ "$key" = auto ] || { IFS='|' read -r _ key _ <<< "$key"; }
    # shellcheck disable=SC2086
    printf '%-44s %9.4f   %s\n' "$key" "$(median ${times[$key]})" "$(spread ${times[$key]})"
  done
  if [ ${#ratios[@]} -eq 0 ]; then echo "no round gave both times"; continue; fi
  awk -v r="$(median "${ratios[@]}")" -v k="${#ratios[@]}" -v lo="$(spread "${ratios[@]}")" \
    'BEGIN{printf "auto against the best finalist of the same round, median of %d rounds: %+.1f%% (ratios %s)\n", k, 100*(r-1), lo}'
  unset times
done
