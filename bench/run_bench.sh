#!/usr/bin/env bash
# Runs colossal_bench and the PyTorch peers (bench/run_pytorch_peer.sh) on the same cases in one
# run and prints tokens/s of each and the ratios. Every run has OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE unset and the same thread count; the peers additionally get tcmalloc and
# OMP_WAIT_POLICY=PASSIVE. Colossal runs with hardware.gemm: auto, in fp32 (oneDNN or BLIS per
# shape when either loads, else OpenBLAS) and bf16 (oneDNN's bf16 GEMM where the CPU has
# AVX512-BF16/AMX, else emulated); Debian's torch 1.13 in fp32; with
# --torch2, a current torch in four configurations (eager with SDPA, compile, bf16 autocast,
# compile + bf16). Each precision is compared with the best peer of that precision.
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: bench/run_bench.sh [--threads N] [--steps N] [--case NAME ...] [--torch2 ENV_SH]
  --threads N      BLAS / torch threads for all (default 2)
  --steps N        timed steps per case (default 5)
  --case NAME      gpt2-124m, quickstart or tiny (repeatable; default all three)
  --torch2 ENV_SH  also run a current PyTorch: ENV_SH activates its venv (bench/make_torch_venv.sh
                   DIR writes DIR/env.sh)
  --no-bf16        skip the bf16 runs
Needs build/bin/colossal_bench (./setup.sh) and, for the torch 1.13 peer, python3-torch and
libtcmalloc-minimal4 (apt-get install python3-torch libtcmalloc-minimal4).
USAGE
}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
threads=2
steps=5
cases=()
torch2=""
bf16=1
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    --case) cases+=("$2"); shift ;;
    --torch2) torch2="$2"; shift ;;
    --no-bf16) bf16=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[ ${#cases[@]} -gt 0 ] || cases=(gpt2-124m quickstart tiny)
bench="$root/build/bin/colossal_bench"
[ -x "$bench" ] || { echo "run_bench.sh: $bench is missing; run ./setup.sh first" >&2; exit 1; }
if [ -n "$torch2" ] && [ ! -f "$torch2" ]; then
  echo "run_bench.sh: --torch2 $torch2: no such file (make one with bench/make_torch_venv.sh DIR)" >&2
  exit 2
fi
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
isa=$(grep -o -w 'avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "CPU: $cpu; ${isa:-no AVX-512}; $threads thread(s) each"

# results[case,config] = tokens/s, rss[case,config] = MiB
declare -A results rss
configs=()
add_config() { case " ${configs[*]} " in *" $1 "*) ;; *) configs+=("$1") ;; esac; }

run_ours() {  # case precision
  local out gemm=auto
  out=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS="$threads" \
        /usr/bin/time -f 'MAXRSS_KB=%M' "$bench" --steps "$steps" --case "$1" --gemm "$gemm" \
        --precision "$2" --threads "$threads" 2>&1) || true
  echo "$out" | grep -v -E '^(RESULT|MAXRSS)' | sed "s/^/  [colossal $2] /"
  results[$1,colossal-$2]=$(echo "$out" | sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p')
  rss[$1,colossal-$2]=$(echo "$out" | sed -n 's/^MAXRSS_KB=//p' | awk '{printf "%.0f", $1/1024}')
  add_config "colossal-$2"
}

run_peer() {  # case name python-env(empty: Debian's) peer-args...
  local c="$1" name="$2" envsh="$3" out
  shift 3
  if [ -n "$envsh" ]; then
    out=$( (. "$envsh" && PYTHON=python "$here/run_pytorch_peer.sh" --preset "$c" \
            --threads "$threads" --steps "$steps" --warmup-steps 2 "$@") 2>/dev/null || true)
  else
    out=$("$here/run_pytorch_peer.sh" --preset "$c" --threads "$threads" --steps "$steps" \
          --warmup-steps 2 "$@" 2>/dev/null || true)
  fi
  out=$(echo "$out" | grep '^RESULT' || true)
  results[$c,$name]=$(echo "$out" | sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p')
  rss[$c,$name]=$(echo "$out" | sed -n 's/.*peak_rss_mib=\([0-9.]*\).*/\1/p' |
                  awk '{printf "%.0f", $1}')
  add_config "$name"
}

for c in "${cases[@]}"; do
  echo "== $c"
  run_ours "$c" fp32
  [ $bf16 = 1 ] && run_ours "$c" bf16
  run_peer "$c" torch1.13 "" --no-sdpa
  if [ -n "$torch2" ]; then
    run_peer "$c" torch2-eager "$torch2" --sdpa
    run_peer "$c" torch2-compile "$torch2" --sdpa --compile
    if [ $bf16 = 1 ]; then
      run_peer "$c" torch2-bf16 "$torch2" --sdpa --bf16
      run_peer "$c" torch2-compile+bf16 "$torch2" --sdpa --compile --bf16
    fi
  fi
done

echo
echo "tokens/s (peak RSS MiB)"
printf '%-11s' case
for k in "${configs[@]}"; do printf ' %20s' "$k"; done
echo
for c in "${cases[@]}"; do
  printf '%-11s' "$c"
  for k in "${configs[@]}"; do
    v="${results[$c,$k]:-}"
    if [ -n "$v" ]; then printf ' %20s' "$v (${rss[$c,$k]:-?})"; else printf ' %20s' "n/a"; fi
  done
  echo
done

echo
echo "colossal against the best peer of the same precision (tokens/s ratio; RSS ratio)"
for c in "${cases[@]}"; do
  for p in fp32 bf16; do
    o="${results[$c,colossal-$p]:-}"
    [ -n "$o" ] || continue
    best=""; best_t=0
    for k in "${configs[@]}"; do
      case "$k" in colossal-*) continue ;; esac
      is_bf16=0; case "$k" in *bf16*) is_bf16=1 ;; esac
      { [ $p = bf16 ] && [ $is_bf16 = 1 ]; } || { [ $p = fp32 ] && [ $is_bf16 = 0 ]; } || continue
      t="${results[$c,$k]:-}"
      [ -n "$t" ] || continue
      if awk -v a="$t" -v b="$best_t" 'BEGIN{exit !(a>b)}'; then best="$k"; best_t="$t"; fi
    done
    if [ -n "$best" ]; then
      awk -v c="$c" -v p="$p" -v o="$o" -v b="$best" -v t="$best_t" -v orss="${rss[$c,colossal-$p]:-0}" \
          -v trss="${rss[$c,$best]:-0}" 'BEGIN{printf "%-11s %4s: colossal %s vs %s %s = %.2fx; RSS %s vs %s MiB = %.2fx\n", c, p, o, b, t, o/t, orss, trss, (trss>0? orss/trss : 0)}'
    else
      echo "$c $p: no peer of this precision ran"
    fi
  done
done
