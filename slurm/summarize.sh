#!/usr/bin/env bash
# Collects the final metrics of every run below DIR (each directory with a metrics.csv, e.g. the
# points of a sweep) into one table: DIR/summary.csv, also printed. A wrapper around
# `colossal_sweep summarize DIR` (see its --help for the columns).
#   usage: slurm/summarize.sh DIR
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
if [ $# -ne 1 ]; then
  echo "summarize.sh: usage: slurm/summarize.sh DIR (see --help)" >&2
  exit 2
fi
dir="$1"
root="${COLOSSAL_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
tool="${COLOSSAL_SWEEP_BIN:-$root/build/bin/colossal_sweep}"
[ -x "$tool" ] || { echo "summarize.sh: $tool is not an executable; build first (cmake --build build)" >&2; exit 2; }
exec "$tool" summarize "$dir"
