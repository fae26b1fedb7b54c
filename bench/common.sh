# Sourced by the bench scripts: the repository root (the working directory from here on), the
# colossal_train binary, MPI allowed as root, and `peer`, which runs a command with
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (as every benchmark peer runs).
root="$(cd "$(dirname "${BASH_SOURCE[1]}")/.." && pwd)"
train="$root/build/bin/colossal_train"
if [ ! -x "$train" ]; then
  echo "$(basename "${BASH_SOURCE[1]}"): $train is missing; run ./setup.sh first" >&2
  exit 1
fi
cd "$root"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
peer() { env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$@"; }
plan="$root/build/bin/colossal_plan"
# A scratch directory, removed on exit, in $work.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# calibrate FILE [RANKS]: this host's hardware spec measured now (colossal_plan --calibrate), with
# 1 rank (all cores) or RANKS ranks (the link between ranks 0 and 1 measured too).
calibrate() {
  if [ "${2:-1}" = 1 ]; then
    peer "$plan" --calibrate --out "$1" > /dev/null
  else
    peer mpirun -np "$2" --oversubscribe "$plan" --calibrate --out "$1" > /dev/null
  fi
}
# cpu_line: "MODEL, N cores, AVX-512: yes|no, AVX512-BF16: yes|no" (every benchmark says which).
cpu_line() {
  echo "$(lscpu | awk -F: '/Model name/{gsub(/^ +/,"",$2); print $2}'), $(nproc) cores," \
       "AVX-512: $(grep -q avx512f /proc/cpuinfo && echo yes || echo no)," \
       "AVX512-BF16: $(grep -q avx512_bf16 /proc/cpuinfo && echo yes || echo no)"
}
# model_file CONFIG DIR: DIR/model.h5 written by one training step of CONFIG (a benchmark's
# weights, whose values do not change its speed).
model_file() {
  echo "# writing a model file: one training step of $1" >&2
  peer "$train" "$1" --set train.steps=1 --set sample.tokens=0 --set log.every=1 \
    --set "log.dir=$2" > "$2.log" 2>&1 || { cat "$2.log" >&2; exit 1; }
}
