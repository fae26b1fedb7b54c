#!/usr/bin/env bash
# Tensor-parallel modes side by side at 8 ranks (oversubscribed on this machine: the tokens/s are
# for the record, not a speed claim): 1d (tp4 x dp2), 2d (2 x 2 grid x dp2), 2.5d (2 x 2 x depth
# 2) and 3d (2 x 2 x 2 cube), for gpt2-124m and a wider model (hidden 2048, 2 layers, GPT-2's
# vocabulary), T=128, global batch 16. Prints per-rank tracked memory (rank 0, by category),
# the tensor group's payload bytes per step on rank 0 (as its communicators count them), and
# tokens/s, next to each mode's share of the weight matrices per rank (1/t, 1/q^2, 1/q^2, 1/q^3).
# The closed forms of those bytes are tested exactly in tests/test_model2d.cpp (2D, 2.5D),
# tests/test_tensor3d.cpp (3D linear) and tests/test_tensor_parallel.cpp (1D).
set -euo pipefail
usage() { echo "usage: bench/run_tensor_modes_bench.sh [--steps N]   (default 2: one warm-up step)"; }
steps=2
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_tensor_modes_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
export OPENBLAS_NUM_THREADS=1
models=("gpt2-124m|--set model.preset=gpt2-124m"
        "wide-2048|--set model.hidden=2048 --set model.heads=16 --set model.ffn_hidden=8192 --set model.layers=2")
modes=("1d tp4 x dp2|1/4|--set parallel.tensor.size=4 --set parallel.data=2 --set train.micro_batch=8"
       "2d 2x2 x dp2|1/4|--set parallel.tensor.size=4 --set parallel.tensor.mode=2d --set parallel.data=2 --set train.micro_batch=8"
       "2.5d 2x2x2|1/4|--set parallel.tensor.size=8 --set parallel.tensor.mode=2.5d --set parallel.tensor.depth=2 --set train.micro_batch=8"
       "3d 2x2x2|1/8|--set parallel.tensor.size=8 --set parallel.tensor.mode=3d --set train.micro_batch=16")
printf '%-10s %-14s %8s | %10s %10s %12s %12s | %12s %9s\n' model mode weights params \
  grads activations total "tp bytes/step" "tokens/s"
for m in "${models[@]}"; do
  name=${m%%|*}; margs=${m#*|}
  for mode in "${modes[@]}"; do
    label=${mode%%|*}; rest=${mode#*|}; share=${rest%%|*}; args=${rest#*|}
    # shellcheck disable=SC2086
    out=$(peer mpirun -np 8 --oversubscribe "$train" configs/gpt2-124m.yaml $margs $args \
          --set train.seq_len=128 --set train.global_batch=16 --set "train.steps=$steps" \
          --set data.val_path= --set sample.tokens=0 --set eval.every=0 --set log.every=100 \
          --set "log.dir=$work/run" 2>&1) || { echo "$out" | tail -20 >&2; exit 1; }
    mem=$(echo "$out" | sed -n 's/^memory (per rank): //p' | head -1)
    field() { echo "$mem" | sed -n "s/.*$1 \([0-9.]* [KMG]*i*B\).*/\1/p"; }
    traffic=$(echo "$out" | sed -n 's/^tensor-parallel traffic (rank 0): \(.*\) per step/\1/p')
    tps=$(echo "$out" | sed -n 's/^throughput \([0-9]*\) tokens.*/\1/p')
    printf '%-10s %-14s %8s | %10s %10s %12s %12s | %12s %9s\n' "$name" "$label" "$share" \
      "$(field params)" "$(field grads)" "$(field activations)" "$(field 'peak total')" \
      "$traffic" "$tps"
  done
done
