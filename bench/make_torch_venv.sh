#!/usr/bin/env bash
# Builds a venv with a current PyTorch from PyPI that runs on the CPU here, the benchmark peer of
# bench/run_bench.sh --torch2 (never a dependency of colossal). PyPI's Linux wheel is built for
# CUDA; with --no-deps and the four NVIDIA libraries it links (plus the pure-Python needs) it
# imports and runs on a machine without a GPU. Writes DIR/env.sh, which activates the venv and
# sets LD_LIBRARY_PATH over those libraries. Needs a Python >= 3.10 (PYTHON, default: the first
# of python3.12, python3.11, python3 found).
set -euo pipefail
usage() {
  echo "usage: bench/make_torch_venv.sh DIR   (then: bench/run_bench.sh --torch2 DIR/env.sh)"
}
[ $# -eq 1 ] || { usage >&2; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
dir="$(mkdir -p "$1" && cd "$1" && pwd)"
# The first candidate that runs (a pyenv shim can exist for a version that is not selected).
py="${PYTHON:-}"
if [ -z "$py" ]; then
  for c in python3.12 python3.11 python3; do
    if command -v "$c" >/dev/null && "$c" -c 'import venv' >/dev/null 2>&1; then py="$c"; break; fi
  done
fi
[ -n "$py" ] || { echo "make_torch_venv.sh: no Python >= 3.10 with venv found (set PYTHON)" >&2; exit 1; }
"$py" -m venv "$dir"
"$dir/bin/pip" install -q --upgrade pip
"$dir/bin/pip" install -q --no-deps 'torch==2.*' 'nvidia-cusparselt-cu13' 'nvidia-nvshmem-cu13' \
  nvidia-cufile 'nvidia-nccl-cu13'
"$dir/bin/pip" install -q filelock typing-extensions setuptools sympy networkx jinja2 fsspec numpy
libs=$(ls -d "$dir"/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null | tr '\n' ':')
cat > "$dir/env.sh" <<EOT
. "$dir/bin/activate"
export LD_LIBRARY_PATH="${libs}/usr/local/cuda/lib64\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
EOT
(. "$dir/env.sh" && python -c 'import torch; print("torch", torch.__version__, "imports")')
echo "ready: bench/run_bench.sh --torch2 $dir/env.sh"
