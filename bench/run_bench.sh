#!/usr/bin/env bash
# Runs colossal_bench and the PyTorch peer (bench/run_pytorch_peer.sh) on the same cases in one run
# and prints tokens/s of each and the ratio. Both run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
# unset and the same thread count; the peer additionally gets tcmalloc and OMP_WAIT_POLICY=PASSIVE.
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: bench/run_bench.sh [--threads N] [--steps N] [--case NAME ...]
  --threads N   BLAS / torch threads for both (default 2)
  --steps N     timed steps per case (default 5)
  --case NAME   gpt2-124m, quickstart or tiny (repeatable; default all three)
Needs build/bin/colossal_bench (./setup.sh) and, for the peer, python3-torch and
libtcmalloc-minimal4 (apt-get install python3-torch libtcmalloc-minimal4).
USAGE
}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
threads=2
steps=5
cases=()
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    --case) cases+=("$2"); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[ ${#cases[@]} -gt 0 ] || cases=(gpt2-124m quickstart tiny)
bench="$root/build/bin/colossal_bench"
[ -x "$bench" ] || { echo "run_bench.sh: $bench is missing; run ./setup.sh first" >&2; exit 1; }

declare -A ours theirs ours_rss theirs_rss
for c in "${cases[@]}"; do
  out=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS="$threads" \
        /usr/bin/time -f 'MAXRSS_KB=%M' "$bench" --steps "$steps" --case "$c" 2>&1)
  echo "$out" | grep -v -E '^(RESULT|MAXRSS)'
  ours[$c]=$(echo "$out" | sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p')
  ours_rss[$c]=$(echo "$out" | sed -n 's/^MAXRSS_KB=//p')
  peer=$("$here/run_pytorch_peer.sh" --preset "$c" --threads "$threads" --steps "$steps" \
         --warmup-steps 2 2>/dev/null | grep '^RESULT' || true)
  theirs[$c]=$(echo "$peer" | sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p')
  theirs_rss[$c]=$(echo "$peer" | sed -n 's/.*peak_rss_mib=\([0-9.]*\).*/\1/p')
done
echo
printf '%-11s %8s | %12s %12s %7s | %12s %12s %7s\n' case threads "colossal t/s" "pytorch t/s" ratio \
  "colossal RSS" "pytorch RSS" ratio
for c in "${cases[@]}"; do
  o=${ours[$c]:-nan}; t=${theirs[$c]:-}
  orss=$(awk -v k="${ours_rss[$c]:-0}" 'BEGIN{printf "%.0f", k/1024}')
  trss=${theirs_rss[$c]:-}
  if [ -n "$t" ]; then
    r=$(awk -v a="$o" -v b="$t" 'BEGIN{printf "%.2fx", a/b}')
    m=$(awk -v a="$orss" -v b="$trss" 'BEGIN{printf "%.2fx", a/b}')
  else
    t="n/a"; r="n/a"; trss="n/a"; m="n/a"
  fi
  printf '%-11s %8s | %12s %12s %7s | %9s MiB %8s MiB %7s\n' "$c" "$threads" "$o" "$t" "$r" "$orss" "$trss" "$m"
done
