#!/usr/bin/env bash
# Runs bench/pytorch_peer.py in the environment where Debian's PyTorch is fastest, so the
# comparison with colossal is against the peer at its best, not at its defaults.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-/usr/bin/python3}"

usage() {
  cat <<'EOF'
Usage: bench/run_pytorch_peer.sh [pytorch_peer.py options]

Runs the PyTorch peer training-throughput benchmark with:
  - OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (let OpenBLAS pick its own kernels),
  - libtcmalloc_minimal.so.4 preloaded (from Debian's libtcmalloc-minimal4; skipped with a
    warning if absent),
  - OMP_WAIT_POLICY=PASSIVE, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS = --threads (default 1).
All arguments go to pytorch_peer.py unchanged. Set PYTHON to use another interpreter
(default /usr/bin/python3, which has Debian's python3-torch).

Examples:
  bench/run_pytorch_peer.sh --preset gpt2-124m --threads 2 --steps 5 --warmup-steps 2
  bench/run_pytorch_peer.sh --preset tiny --threads 2

pytorch_peer.py's own options:
EOF
  local options
  if options=$("$python" "$here/pytorch_peer.py" --help 2>/dev/null); then
    printf '%s\n' "$options" | sed -n '/^options:/,$p;/^optional arguments:/,$p'
  else
    echo "  (listed where $python imports torch: apt-get install python3-torch)"
  fi
}

# The thread count must reach OpenMP and OpenBLAS through the environment before torch loads,
# so it is read out of the arguments here rather than left to the script alone.
threads=1
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    -h|--help) usage; exit 0 ;;
    --threads) threads="${args[i + 1]:-1}" ;;
    --threads=*) threads="${args[i]#--threads=}" ;;
  esac
done
if ! [[ "$threads" =~ ^[1-9][0-9]*$ ]]; then
  echo "run_pytorch_peer.sh: --threads must be a positive integer, got '$threads'" >&2
  exit 2
fi

# tcmalloc recycles autograd's many short-lived large buffers far more cheaply than glibc
# malloc, which returns them to the kernel and page-faults them back in every step.
preload=""
for lib in "$(ldconfig -p 2>/dev/null | awk '/libtcmalloc_minimal\.so\.4 /{print $NF; exit}')" \
           /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4; do
  if [[ -n "$lib" && -e "$lib" ]]; then preload="$lib"; break; fi
done
if [[ -z "$preload" ]]; then
  echo "run_pytorch_peer.sh: warning: libtcmalloc_minimal.so.4 not found" \
       "(apt-get install libtcmalloc-minimal4); running with glibc malloc" >&2
fi

# PASSIVE: idle OpenMP workers sleep instead of spinning, so they do not steal the cores the
# OpenBLAS threads need between torch's OpenMP regions (2-core machines suffer most).
exec env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
  ${preload:+LD_PRELOAD="$preload${LD_PRELOAD:+:$LD_PRELOAD}"} \
  OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" \
  "$python" "$here/pytorch_peer.py" "$@"
