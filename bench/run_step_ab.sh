#!/usr/bin/env bash
# A/B step time of two colossal_train builds on the same configs, in one run: rounds alternate
# A and B (so a drift in the machine's load hits both alike), each run trains --steps steps with
# a metrics row every step and no validation, sampling or checkpoints, and the step time of a run
# is the median of its metrics.csv step_seconds after the first (warm-up) step. The table gives
# each build's median over the rounds and B/A. Used for issue 21's "step time unchanged": A the
# commit before the one-step redesign, B main.
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: bench/run_step_ab.sh --a DIR --b DIR [--config FILE ...] [--steps N] [--rounds N]
                            [--threads N] [--set KEY=VALUE ...]
  --a DIR, --b DIR  build directories holding bin/colossal_train (e.g. an old checkout's build/)
  --config FILE     a training config (repeatable; default configs/quickstart.yaml)
  --steps N         steps per run (default 6; the first is warm-up and not counted)
  --rounds N        A/B rounds (default 3)
  --threads N       OMP/BLAS threads of every run (default 2)
  --set KEY=VALUE   an override passed to both builds (repeatable)
Every run has OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset. The configs are read by both
builds, so use keys both understand.
USAGE
}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
a="" b="" steps=6 rounds=3 threads=2
configs=() sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --a) a="$2"; shift ;;
    --b) b="$2"; shift ;;
    --config) configs+=("$2"); shift ;;
    --steps) steps="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --threads) threads="$2"; shift ;;
    --set) sets+=(--set "$2"); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_step_ab.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$a" ] || [ -z "$b" ]; then
  echo "run_step_ab.sh: --a and --b are required" >&2; usage >&2; exit 2
fi
for d in "$a" "$b"; do
  [ -x "$d/bin/colossal_train" ] || {
    echo "run_step_ab.sh: $d/bin/colossal_train is missing (build it: cmake --build DIR --target colossal_train)" >&2
    exit 1
  }
done
if [ "$steps" -lt 2 ]; then echo "run_step_ab.sh: --steps must be at least 2" >&2; exit 2; fi
[ ${#configs[@]} -gt 0 ] || configs=("$root/configs/quickstart.yaml")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
isa=$(grep -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "CPU: $cpu; $isa; $threads thread(s); $steps steps x $rounds rounds per build"
echo "A: $a"
echo "B: $b"

# median of the numbers on stdin
median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) {print "nan"; exit} m=int((NR+1)/2);
  if (NR%2) print v[m]; else printf "%.6g\n", (v[m]+v[m+1])/2}'; }

run_one() {  # build config tag -> prints the run's median step seconds
  local dir="$work/$3"
  rm -rf "$dir"
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS="$threads" \
      OPENBLAS_NUM_THREADS="$threads" \
      "$1/bin/colossal_train" "$2" --set train.steps="$steps" --set log.every=1 \
      --set log.dir="$dir" --set eval.every=0 --set sample.tokens=0 --set checkpoint.every=0 \
      "${sets[@]}" > "$work/$3.out" 2>&1 || {
    echo "run_step_ab.sh: $1/bin/colossal_train $2 failed:" >&2
    tail -n 20 "$work/$3.out" >&2
    exit 1
  }
  awk -F, 'NR==1 {for (i=1;i<=NF;i++) if ($i=="step_seconds") c=i; next}
           c && NR>2 && $c != "" {print $c}' "$dir/metrics.csv" | median
}

printf '%-28s %12s %12s %8s\n' "config" "A s/step" "B s/step" "B/A"
for config in "${configs[@]}"; do
  name=$(basename "$config" .yaml)
  ra=() rb=()
  for r in $(seq "$rounds"); do
    ra+=("$(run_one "$a" "$config" "$name-a$r")")
    rb+=("$(run_one "$b" "$config" "$name-b$r")")
  done
  ma=$(printf '%s\n' "${ra[@]}" | median)
  mb=$(printf '%s\n' "${rb[@]}" | median)
  printf '%-28s %12.4f %12.4f %8.3f\n' "$name" "$ma" "$mb" "$(awk -v x="$mb" -v y="$ma" 'BEGIN {print x/y}')"
  echo "  rounds A: ${ra[*]}; B: ${rb[*]}"
done
