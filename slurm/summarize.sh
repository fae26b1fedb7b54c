#!/usr/bin/env bash
# Collects the final metrics of every run below DIR (each directory with a metrics.csv, e.g. the
# points of a sweep) into one table: DIR/summary.csv, also printed. A wrapper around
# `colossal_sweep summarize DIR` (see its --help for the columns).
#   usage: slurm/summarize.sh DIR
set -euo pipefail
dir="${1:?usage: slurm/summarize.sh DIR}"
root="${COLOSSAL_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
tool="${COLOSSAL_SWEEP_BIN:-$root/build/bin/colossal_sweep}"
[ -x "$tool" ] || { echo "summarize.sh: $tool is not an executable; build first (cmake --build build)" >&2; exit 2; }
exec "$tool" summarize "$dir"
