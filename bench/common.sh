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
