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
