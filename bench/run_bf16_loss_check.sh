#!/usr/bin/env bash
# bf16 against fp32 on the host, loss for loss: the same config and seed trained with
# train.precision fp32 and bf16 (hardware.gemm as given, auto by default: oneDNN's bf16 GEMM where
# the CPU has AVX512-BF16 or AMX, emulated otherwise), validated on the whole validation set at the
# last step. Prints each run's GEMM line, final validation loss, tokens/s and the relative
# difference, against issue 24's target: bf16's final validation loss within 2% of fp32's after
# 300 quickstart steps. A measurement, run by hand (minutes); the tests never time or train this
# long.
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: bench/run_bf16_loss_check.sh [--config FILE] [--steps N] [--threads N] [--gemm G]
                                    [--set KEY=VALUE ...]
  --config FILE   the training config (default configs/quickstart.yaml)
  --steps N       steps of each run (default 300)
  --threads N     OMP/BLAS threads (default 2)
  --gemm G        hardware.gemm of both runs (default auto)
  --set KEY=VALUE an override for both runs (repeatable)
Both runs have OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset.
USAGE
}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
config="configs/quickstart.yaml" steps=300 threads=2 gemm=auto
sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    --threads) threads="$2"; shift ;;
    --gemm) gemm="$2"; shift ;;
    --set) sets+=(--set "$2"); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_bf16_loss_check.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
isa=$(grep -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "CPU: $cpu; $isa; $threads thread(s); $config, $steps steps, hardware.gemm $gemm"

declare -A loss speed gemm_line
for precision in fp32 bf16; do
  dir="$work/$precision"
  peer env OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" \
      "$train" "$config" --set train.steps="$steps" --set train.precision="$precision" \
      --set hardware.gemm="$gemm" --set eval.every="$steps" --set sample.tokens=0 \
      --set checkpoint.every=0 --set log.dir="$dir" "${sets[@]}" > "$work/$precision.out" 2>&1 || {
    echo "run_bf16_loss_check.sh: the $precision run failed:" >&2
    tail -n 20 "$work/$precision.out" >&2
    exit 1
  }
  loss[$precision]=$(awk -F, 'NR==1 {for (i=1;i<=NF;i++) if ($i=="val_loss") c=i; next}
                              c && $c != "" && $c != "nan" {v=$c} END {print v}' "$dir/metrics.csv")
  speed[$precision]=$(sed -n 's/.*| \([0-9.]*\) tok\/s |.*/\1/p' "$work/$precision.out" | tail -n 1)
  gemm_line[$precision]=$(grep -m1 '^gemm:' "$work/$precision.out" | sed 's/ (hardware.gemm)$//' || echo "gemm: ?")
done
printf '%-6s %-52s %14s %12s\n' "" "GEMM" "final val loss" "last tok/s"
for precision in fp32 bf16; do
  printf '%-6s %-52s %14s %12s\n' "$precision" "${gemm_line[$precision]#gemm: }" \
      "${loss[$precision]}" "${speed[$precision]}"
done
awk -v a="${loss[fp32]}" -v b="${loss[bf16]}" 'BEGIN {
  d = (b - a) / a * 100;
  printf "bf16 - fp32: %+.3f%% of fp32'"'"'s final validation loss (target: within 2%%): %s\n", d,
         (d < 2 && d > -2) ? "met" : "NOT met" }'
