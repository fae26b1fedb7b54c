#!/usr/bin/env bash
# The cost model against measurement on this machine: calibrates the host (colossal_plan
# --calibrate, once with 1 rank x 2 threads and once with 2 ranks x 1 thread), then for small
# GPT-2 and OPT configs under 1-rank and 2-rank layouts and several checkpointing policies runs
# colossal_train --profile-steps N and prints predicted against measured step time and memory.
# Ends with the time of the symbolic pass for OPT-175B. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are
# unset, as for every benchmark.
set -euo pipefail
usage() {
  echo "usage: bench/run_cost_model_bench.sh [--steps N] [--quick | --parallel-only]"
  echo "  defaults: 4 profiled steps per run; --quick runs only the 1-rank rows, --parallel-only"
  echo "  only the 2-rank rows"
}
steps=4
quick=0
serial=1
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift ;;
    --quick) quick=1 ;;
    --parallel-only) serial=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_cost_model_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
echo "calibrating (1 rank x 2 threads, then 2 ranks x 1 thread) ..."
calibrate "$work/hw1.yaml"
calibrate "$work/hw2.yaml" 2

# A small GPT-2 (6 x 384, T=256) and OPT (4 x 256, T=128) beside the quickstart model.
small_gpt2=(--set model.layers=6 --set model.hidden=384 --set model.heads=6 --set model.ffn_hidden=1536
            --set train.seq_len=256 --set model.max_seq=256 --set train.global_batch=8 --set train.micro_batch=4)
small_opt=(--set model.arch=opt --set train.global_batch=16 --set train.micro_batch=8)

run() {  # ranks, label, config args...
  local ranks="$1" label="$2"; shift 2
  local hw="$work/hw$ranks.yaml" out line
  local cmd=("$train" "$@" --profile-steps "$steps" --set "hardware.file=$hw" --set eval.every=0
             --set data.val_path= --set sample.tokens=0 --set "log.dir=$work/run")
  if [ "$ranks" = 1 ]; then
    out=$(peer "${cmd[@]}" 2>&1) || { echo "$out" >&2; exit 1; }
  else
    out=$(peer mpirun -np "$ranks" --oversubscribe "${cmd[@]}" 2>&1) || { echo "$out" >&2; exit 1; }
  fi
  line=$(echo "$out" | grep '^cost model (rank 0, hardware' | head -1)
  # "... step P s predicted, M s measured (E%); memory A predicted, B tracked"
  local p m e a b
  p=$(echo "$line" | sed -n 's/.*step \([0-9.]*\) s predicted.*/\1/p')
  m=$(echo "$line" | sed -n 's/.*predicted, \([0-9.]*\) s measured.*/\1/p')
  e=$(echo "$line" | sed -n 's/.*measured (\([-+0-9.]*%\)).*/\1/p')
  a=$(echo "$line" | sed -n 's/.*; memory \(.*\) predicted, .*/\1/p')
  b=$(echo "$line" | sed -n 's/.* predicted, \(.*\) tracked$/\1/p')
  printf '%-44s %9s %9s %8s   %-10s %-10s\n' "$label" "$p" "$m" "$e" "$a" "$b"
}

printf '\n%-44s %9s %9s %8s   %-10s %-10s\n' "config / layout / policy" "pred s" "meas s" "error" \
  "pred mem" "tracked"
if [ "$serial" = 1 ]; then
for policy in none full sqrt selective; do
  run 1 "quickstart / 1 rank / $policy" configs/quickstart.yaml --set "checkpointing.policy=$policy"
done
run 1 "quickstart / 1 rank / rotor 0.15 GiB" configs/quickstart.yaml \
  --set checkpointing.policy=rotor --set checkpointing.memory_budget=0.15
for policy in none full; do
  run 1 "gpt2 6x384 T256 / 1 rank / $policy" configs/quickstart.yaml "${small_gpt2[@]}" \
    --set "checkpointing.policy=$policy"
done
run 1 "opt 4x256 / 1 rank / none" configs/quickstart.yaml "${small_opt[@]}"
run 1 "opt 4x256 / 1 rank / full" configs/quickstart.yaml "${small_opt[@]}" --set checkpointing.policy=full
fi
if [ "$quick" = 0 ]; then
  run 2 "quickstart / dp2 / none" configs/quickstart.yaml --set parallel.data=2 --set train.micro_batch=8
  run 2 "quickstart / dp2 ZeRO-2 / full" configs/quickstart.yaml --set parallel.data=2 --set train.micro_batch=8 \
    --set parallel.zero.stage=2 --set checkpointing.policy=full
  run 2 "quickstart / tp2 / none" configs/quickstart.yaml --set parallel.tensor.size=2
  run 2 "quickstart / tp2 split / sqrt" configs/quickstart.yaml --set parallel.tensor.size=2 \
    --set parallel.tensor.sequence_split=true --set checkpointing.policy=sqrt
  run 2 "quickstart / pp2 1f1b / none" configs/quickstart.yaml --set parallel.pipeline.size=2 \
    --set train.micro_batch=4
  run 2 "quickstart / sp2 / none" configs/quickstart.yaml --set parallel.sequence=2
  run 2 "gpt2 6x384 T256 / dp2 / none" configs/quickstart.yaml "${small_gpt2[@]}" --set parallel.data=2 \
    --set train.micro_batch=2
  run 2 "opt 4x256 / tp2 / full" configs/quickstart.yaml "${small_opt[@]}" \
    --set parallel.tensor.size=2 --set checkpointing.policy=full
fi

echo
echo "symbolic pass, OPT-175B (96 layers, T=2048, tp8 x pp8 stage 0, rotor under 60 GiB, a100-80g):"
/usr/bin/time -f "  %e s wall, %M KiB peak RSS (whole program)" "$plan" configs/gpt2-124m.yaml --profile \
  --set model.preset=opt-175b --set train.seq_len=2048 --set train.global_batch=512 \
  --set train.micro_batch=1 --set parallel.tensor.size=8 --set parallel.pipeline.size=8 \
  --set parallel.data=8 --set checkpointing.policy=rotor --set checkpointing.memory_budget=60 \
  --hardware a100-80g | grep -E "ops costed|predicted|activation checkpointing"
