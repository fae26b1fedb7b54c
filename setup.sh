#!/usr/bin/env bash
# Installs colossal's Debian dependencies (when missing), prepares the quickstart corpus and builds
# the release configuration. Idempotent and quiet; a second run with nothing to do takes seconds.
#
#   ./setup.sh            install + build (build/bin/colossal_train, ...)
#   ./setup.sh --test     also run the test suite, then the unit tests under address/UB sanitizers
#   ./setup.sh --cuda     also build Kokkos 3.4.01 for CUDA into .deps/kokkos-cuda (patched; from
#                         PyPI) and the project with it into build-cuda/ (preset cuda; compiles
#                         without a GPU, runs only where one is visible)
#   ./setup.sh --help
set -euo pipefail

usage() {
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
}

run_tests=0
cuda=0
for arg in "$@"; do
  case "$arg" in
    --test) run_tests=1 ;;
    --cuda) cuda=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")"
jobs=$(nproc 2>/dev/null || echo 2)
log=$(mktemp /tmp/colossal-setup.XXXXXX)
trap 'rm -f "$log"' EXIT

step() {
  if [ "${CI:-}" = true ]; then printf '[setup %s] %s\n' "$(date +%T)" "$*"
  else printf '[setup] %s\n' "$*"; fi
}
quietly() {
  # Runs a command with its output in the log; shows the log only when it fails.
  if ! "$@" >"$log" 2>&1; then
    echo "setup.sh: '$*' failed:" >&2
    tail -n 60 "$log" >&2
    exit 1
  fi
}

packages=(cmake make g++ libopenmpi-dev openmpi-bin libtrilinos-kokkos-dev
          libtrilinos-kokkos-kernels-dev libhdf5-openmpi-dev hdf5-tools libyaml-cpp-dev
          nlohmann-json3-dev
          libopenblas-dev libgtest-dev python3
          # optional host GEMM backends (hardware.gemm: blis | onednn | auto), loaded at run time;
          # oneDNN's headers build its matmul primitive path (core/dnnl_matmul.hpp)
          libblis4-openmp libdnnl2 libdnnl-dev)
# The CUDA build fetches Kokkos with pip and patches it.
[ "$cuda" = 1 ] && packages+=(python3-pip patch)
# The Python-driven tests (tests/python/: safetensors export, tokenizer) read files with numpy and
# h5py from Debian, and safetensors and tokenizers from PyPI in a venv (below).
[ "$run_tests" = 1 ] && packages+=(python3-numpy python3-h5py python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  step "installing ${missing[*]}"
  quietly $sudo apt-get update -qq
  quietly env DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

step "preparing the quickstart corpus (data/)"
quietly scripts/prepare_data.sh

python_flag=()
if [ "$run_tests" = 1 ]; then
  # Best effort: without PyPI the venv lacks the two packages and those tests report skipped.
  venv=.deps/pytest
  if [ ! -x "$venv/bin/python" ]; then
    step "creating the test venv $venv (Debian python3, numpy, h5py; safetensors, tokenizers from PyPI)"
    /usr/bin/python3 -m venv --system-site-packages "$venv" >"$log" 2>&1 || rm -rf "$venv"
  fi
  if [ -x "$venv/bin/python" ]; then
    "$venv/bin/python" -c 'import safetensors, tokenizers' 2>/dev/null ||
      timeout 300 "$venv/bin/pip" install -q safetensors tokenizers >"$log" 2>&1 ||
      step "warning: pip could not install safetensors/tokenizers; the python tests will skip"
    python_flag=(-DCOLOSSAL_PYTHON="$PWD/$venv/bin/python")
  fi
fi

step "building release into build/ ($jobs jobs)"
quietly cmake --preset release "${python_flag[@]}"
quietly cmake --build --preset release -j "$jobs"

if [ "$run_tests" = 1 ]; then
  step "running the test suite (ctest --preset release)"
  ctest --preset release -j "$jobs"
  step "building the sanitizer configuration into build-asan/"
  quietly cmake --preset asan
  quietly cmake --build --preset asan -j "$jobs"
  step "running the unit tests under address and UB sanitizers (ctest --preset asan)"
  ctest --preset asan -j "$jobs"
fi
if [ "$cuda" = 1 ]; then
  step "building Kokkos 3.4.01 for CUDA into .deps/kokkos-cuda (scripts/build_kokkos_cuda.sh)"
  quietly scripts/build_kokkos_cuda.sh --jobs "$jobs"
  step "building the CUDA configuration into build-cuda/ ($jobs jobs)"
  quietly cmake --preset cuda
  quietly cmake --build --preset cuda -j "$jobs"
fi
step "done: try build/bin/colossal_train configs/quickstart.yaml"
